#pragma once
// AdamW with decoupled weight decay (none on parameters declared without it: norms and
// embeddings by default). Moments live in the optimizer arena on the parameters' backend,
// laid out like the flat parameter buffer.
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/arena.h"
#include "model/parameters.h"
#include "model/shard_layout.h"
#include "model/sharded_checkpoint.h"

namespace bottle {

// The optimizer.* keys' values (TrainConfig::adamw()); their defaults are the configuration's
// (train/train_config.h), so none here.
struct AdamWConfig {
  float lr{};
  float beta1{}, beta2{}, eps{};
  float weight_decay{};
};

class AdamW {
 public:
  // Updates (and keeps moments for) what `shard` owns of the flat parameter buffer: all of it
  // (an empty layout: the whole buffer), or a ZeRO rank's slices.
  AdamW(const ParameterStore& params, const AdamWConfig& config, ShardLayout shard = {});

  // Update steps_taken() + 1 of every parameter in the range with learning rate `lr`, in one
  // pass that also writes the range's compute copy (the bf16 weights of a mixed-precision
  // run). control: the step's control tensor (Backend::clip_and_check) in the backend's
  // memory, which scales the gradients (clipping) and skips a non-finite step on the device.
  // The host counts the step with count_step() once it knows the step was taken.
  // grad_shard: [shard] the owned gradients end to end (ZeRO-2), read instead of the store's
  // flat buffer.
  void step(Backend& be, const ParameterStore& params, float lr, Tensor control,
            Tensor grad_shard = {});
  void count_step() { ++step_; }

  size_t bytes() const { return arena_.bytes(); }  // the moments held
  int64_t steps_taken() const { return step_; }
  void set_steps_taken(int64_t step) { step_ = step; }
  // Takes this rank's slices out of whole-buffer moments.
  void load_moments(Tensor m_whole, Tensor v_whole);
  // The state as a checkpoint names it, with what this rank holds of each: "exp_avg/" and
  // "exp_avg_sq/", the owned stretches end to end. A sharded checkpoint writes and reads them
  // in place (model/sharded_checkpoint.h): nothing is gathered.
  std::vector<FlatSource> held_state() const;
  // The owned part of the flat parameter buffer.
  const ShardLayout& shard() const { return shard_; }

 private:
  // One stretch of owned parameters, updated in one pass.
  struct Part {
    ElementRange flat;                   // in the parameter buffer
    int64_t local = 0;                   // where its moments start
    std::vector<ElementRange> no_decay;  // ranges of the stretch without weight decay
  };
  AdamWConfig config_;
  ShardLayout shard_;
  std::vector<Part> parts_;  // in flat order
  Backend* backend_;         // the parameters'
  Arena arena_;              // on the parameters' backend
  Tensor m_, v_;             // [shard] each: the owned stretches end to end
  int64_t step_ = 0;
};

}  // namespace bottle
