#pragma once
// All parameters of a model in one contiguous buffer (and their gradients in another), so
// that the optimizer, gradient clipping and data-parallel reductions see flat memory.
// Parameters are named as in the HF checkpoint (docs/design.md §12).
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/arena.h"
#include "core/backend.h"
#include "nn/param.h"

namespace bottle {

enum class ParamInit { normal, ones, zeros };

struct ParamSpec {
  std::string name;
  Shape shape;  // this rank's slice
  ParamInit init = ParamInit::normal;
  float std = 0.02f;
  bool weight_decay = true;  // off for norms and embeddings
  int64_t offset = 0;        // in elements, into the flat buffers
  // Tensor parallelism: the slice is [shard_offset, shard_offset + shape[shard_dim]) of
  // full_shape along shard_dim; shard_dim < 0: the whole parameter, the same on every rank.
  Shape full_shape{};
  int shard_dim = -1;
  int64_t shard_offset = 0;

  bool sharded() const { return shard_dim >= 0; }
  // Index into the whole parameter of element `local` of this rank's slice.
  int64_t global_index(int64_t local) const;
  // The same for the slice a rank with offset `offset` along shard_dim holds.
  int64_t global_index(int64_t local, int64_t offset) const;
};

class ParameterStore {
 public:
  // Planning: declare every parameter, then allocate() once. The flat buffers are padded
  // to a multiple of `multiple` elements (ZeRO-1 cuts them into equal shards).
  void declare(ParamSpec spec);
  // The buffers come from `memory` (the backend that runs the model); reserve_only: plans
  // the footprint without using memory (Arena's reserve mode). compute: the dtype of the
  // weights GEMMs read; bf16 adds a bf16 copy of the values (refresh_compute() fills it).
  void allocate(Backend& memory, int64_t multiple = 1, bool reserve_only = false,
                DType compute = DType::f32);
  // The backend the buffers belong to (it stages them to and from the host).
  Backend& backend() const { return value_arena_->backend(); }

  Param get(const std::string& name) const;  // throws naming the parameter
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  Param at(size_t i) const;
  Tensor values() const { return values_; }           // [padded count]
  Tensor grads() const { return grads_; }             // [padded count]
  Tensor compute_values() const { return compute_; }  // [padded count]: values_ or bf16
  bool mixed_precision() const { return compute_.dtype != values_.dtype; }
  // The compute copy of values [begin, end) (end < 0: to the end) after an update or a load;
  // a no-op without mixed precision.
  void refresh_compute(Backend& be, int64_t begin = 0, int64_t end = -1) const;
  int64_t count() const { return count_; }  // elements up to the last parameter's end
  size_t bytes() const { return value_arena_ ? value_arena_->bytes() : 0; }  // values (= grads)
  // The bf16 compute copy (0 without mixed precision).
  size_t compute_bytes() const { return compute_arena_ ? compute_arena_->bytes() : 0; }

  // Each parameter from a seed derived from (seed, its name), element by element, so that
  // any slice of it is the same whatever the layout that asks for it.
  void initialize(uint64_t seed);

 private:
  std::vector<ParamSpec> specs_;
  std::map<std::string, size_t> index_;
  int64_t count_ = 0;
  std::unique_ptr<Arena> value_arena_, grad_arena_, compute_arena_;
  Tensor values_, grads_, compute_;
};

// A standard normal for element `index` of the stream `key` (counter-based, stateless).
float counter_normal(uint64_t key, uint64_t index);
uint64_t hash_name(uint64_t seed, const std::string& name);

}  // namespace bottle
