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
#include "backend/backend.h"
#include "model/shard_layout.h"
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

// A unit: parameters gathered, reduced and (under ZeRO-2) given gradient memory together —
// the embedding, each block, the head — as a flat range [begin, end).
struct ParamUnit {
  int64_t begin = 0, end = 0;
  // ZeRO-2 and 3: its gradients (under ZeRO-3 its values too) stay whole for the whole step (a
  // tied table, which the LM head writes first and the embedding last, or which the
  // pipeline's two ends add up after it).
  bool kept = false;
  int64_t kept_offset = 0;  // where in the kept buffers (gradients; values under ZeRO-3)
  int64_t count() const { return end - begin; }
};

// How ZeRO keeps a store's buffers (docs/design.md §9): what ParameterStore::allocate and
// LlamaModel take.
struct ParamSharding {
  // ZeRO: the flat buffers' size (and under grad_slots every unit's) a multiple of it.
  int64_t ranks = 1;
  // ZeRO-2 and 3: gradients held per unit in two slots.
  bool grad_slots = false;
  // ZeRO-3: the fp32 masters kept as this rank's shard alone (rank `rank` of `ranks`, one slice
  // of each bucket of `bucket` elements cut inside the units: DataParallel's cut), and each
  // unit's values gathered into two slots the way its gradients are held.
  bool value_slots = false;
  int rank = 0;
  int64_t bucket = 0;
  ParamSharding(int64_t ranks = 1, bool grad_slots = false)  // NOLINT: a count converts
      : ranks(ranks), grad_slots(grad_slots) {}
};

class ParameterStore {
 public:
  // Planning: begin a unit, declare its parameters, ..., then allocate() once. The flat
  // buffers are padded to a multiple of `multiple` elements (ZeRO cuts them into equal
  // shards).
  //
  // align: the unit starts at a multiple of it (and of 128), so that a ZeRO-2 shard cuts
  // every unit into equal slices; 1 leaves the layout as without units.
  void begin_unit(int64_t align = 1, bool kept = false);
  void declare(ParamSpec spec);
  // The buffers come from `memory` (the backend that runs the model); reserve_only: plans
  // the footprint without using memory (Arena's reserve mode). compute: the dtype of the
  // weights GEMMs read; bf16 adds a bf16 copy of the values (refresh_compute() fills it).
  // sharding.grad_slots (ZeRO-2 and 3): no flat gradient buffer; unit u's gradients live in
  // slot u % 2 of two buffers as long as the largest unit of each parity (the kept units' in a
  // buffer of their own), which the data-parallel trainer zeroes before the unit's backward and
  // reduce-scatters after it: consecutive units of a backward never share a slot.
  // sharding.value_slots (ZeRO-3): values() is this rank's shard of the masters
  // (values_shard()); unit u's values (and bf16 compute copy) are read from slot u % 2, which
  // the data-parallel trainer gathers before the unit's forward and backward; a kept unit's
  // stay whole for the step, gathered after each update.
  void allocate(Backend& memory, const ParamSharding& sharding = {}, bool reserve_only = false,
                DType compute = DType::f32);
  // The backend the buffers belong to (it stages them to and from the host).
  Backend& backend() const { return *backend_; }

  Param get(const std::string& name) const;  // throws naming the parameter
  bool contains(const std::string& name) const { return index_.count(name) != 0; }
  const std::vector<ParamSpec>& specs() const { return specs_; }
  Param at(size_t i) const;
  // [padded count], or under value_slots [padded count / ranks] this rank's shard (the
  // owned slices of values_shard() end to end).
  Tensor values() const { return values_; }
  // Elements of the flat layout, padding included (the whole of values() without value_slots).
  int64_t padded() const { return padded_; }
  bool value_slots() const { return value_slots_; }
  // value_slots: what this rank owns of the flat layout (DataParallel's cut).
  const ShardLayout& values_shard() const { return values_shard_; }
  // value_slots: [units()[u].count()] where unit u's values are gathered (fp32), and their
  // compute copy (bf16 under mixed precision; the same tensor in fp32).
  Tensor unit_values(size_t u) const;
  Tensor unit_compute(size_t u) const;
  // Parameter i's values from `host` [its shape]: the whole, or under value_slots the owned
  // slices of it (and the whole where its unit is kept). The compute copy follows with
  // refresh_compute().
  void set_values(size_t i, const float* host) const;
  // [padded count]; not under grad_slots (each unit's are unit_grads(u) there).
  Tensor grads() const;
  bool grad_slots() const { return grad_slots_; }
  // The units in flat order, tiling [0, padded count) (one unit when none was begun).
  const std::vector<ParamUnit>& units() const { return units_; }
  // [units()[u].count()] the gradients of unit u: in the flat buffer, its slot or the kept
  // buffer.
  Tensor unit_grads(size_t u) const;
  // Zeroes the gradients that accumulate over the step: the flat buffer, or under grad_slots
  // the kept units' (the slots are zeroed unit by unit as backward reaches them).
  void zero_grads(Backend& be) const;
  // [padded count]: values_ or bf16; empty under value_slots (each unit's is unit_compute(u)).
  Tensor compute_values() const { return compute_; }
  bool mixed_precision() const { return compute_dtype_ != values_.dtype; }
  // The compute copy of values [begin, end) (end < 0: to the end) after an update or a load;
  // a no-op without mixed precision. Under value_slots: the kept units' whole copies (the
  // slots are cast as they are gathered).
  void refresh_compute(Backend& be, int64_t begin = 0, int64_t end = -1) const;
  int64_t count() const { return count_; }  // elements up to the last parameter's end
  size_t bytes() const { return value_arena_ ? value_arena_->bytes() : 0; }  // values
  size_t grad_bytes() const { return grad_arena_ ? grad_arena_->bytes() : 0; }
  // The bf16 compute copy (0 without mixed precision).
  size_t compute_bytes() const { return compute_arena_ ? compute_arena_->bytes() : 0; }

  // Each parameter from a seed derived from (seed, its name), element by element, so that
  // any slice of it is the same whatever the layout that asks for it.
  void initialize(uint64_t seed);

 private:
  size_t unit_of(int64_t offset) const;

  std::vector<ParamSpec> specs_;
  std::map<std::string, size_t> index_;
  int64_t count_ = 0;
  std::vector<ParamUnit> units_;
  int64_t padded_ = 0;
  bool grad_slots_ = false, value_slots_ = false;
  DType compute_dtype_ = DType::f32;
  Backend* backend_ = nullptr;  // the one given to allocate()
  std::unique_ptr<Arena> value_arena_, grad_arena_, compute_arena_;
  Tensor values_, grads_, compute_;
  Tensor grad_slot_[2];  // [largest unit of each parity] grad_slots
  Tensor kept_grads_;    // [kept units end to end] grad_slots
  // value_slots.
  ShardLayout values_shard_;
  Tensor value_slot_[2], compute_slot_[2];  // [largest unit of each parity] fp32, compute dtype
  Tensor kept_values_, kept_compute_;       // [kept units end to end] fp32, compute dtype
};

// A standard normal for element `index` of the stream `key` (counter-based, stateless).
float counter_normal(uint64_t key, uint64_t index);
uint64_t hash_name(uint64_t seed, const std::string& name);

}  // namespace bottle
