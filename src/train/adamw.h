#pragma once
// AdamW with decoupled weight decay (none on parameters declared without it: norms and
// embeddings by default). Moments live in the optimizer arena on the parameters' backend,
// laid out like the flat parameter buffer: the owned stretches of the parameters routed to it
// end to end.
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "core/arena.h"
#include "model/parameters.h"
#include "model/shard_layout.h"
#include "model/sharded_checkpoint.h"
#include "train/optimizer.h"

namespace bottle {

// The optimizer.* keys' values (TrainConfig::adamw()); their defaults are the configuration's
// (train/train_config.h), so none here.
struct AdamWConfig {
  float lr{};
  float beta1{}, beta2{}, eps{};
  float weight_decay{};
};

class AdamW : public Optimizer {
 public:
  // Updates (and keeps moments for) what `shard` owns of the flat parameter buffer: all of it
  // (an empty layout: the whole buffer), or a ZeRO rank's slices; of it, the parameters whose
  // role is in `roles` (empty: every parameter, the padding between them included, so that
  // the owned stretches are updated in as few passes as they can).
  AdamW(const ParameterStore& params, const AdamWConfig& config, ShardLayout shard = {},
        std::vector<ParamRole> roles = {});

  // The elements of each moment such an optimizer holds (the memory plan's).
  static int64_t moment_elements(const ParameterStore& params, const ShardLayout& shard,
                                 const std::vector<ParamRole>& roles);

  const char* name() const override { return "adamw"; }
  // One pass per owned stretch, which also writes its compute copy.
  void step(Backend& be, const ParameterStore& params, float lr, Tensor control,
            Tensor grad_shard = {}) override;
  // The same as step `step` (1-based: the bias correction's), for an optimizer that holds
  // this one for some of its parameters and counts the steps itself.
  void step_at(Backend& be, const ParameterStore& params, float lr, Tensor control,
               Tensor grad_shard, int64_t step);
  size_t bytes() const override { return arena_.bytes(); }  // the moments held
  // "exp_avg/" and "exp_avg_sq/", the owned stretches end to end.
  std::vector<FlatSource> held_state() const override;

 private:
  // One stretch of owned parameters, updated in one pass.
  struct Part {
    ElementRange flat;    // in the parameter buffer
    int64_t local = 0;    // where it lies in the shard (ZeRO-2's gradients, ZeRO-3's values)
    int64_t moments = 0;  // where its moments start
    std::vector<ElementRange> no_decay;  // ranges of the stretch without weight decay
  };
  AdamWConfig config_;
  std::vector<Part> parts_;        // in flat order
  std::vector<ShardPiece> owned_;  // the parts as pieces of the moments (held_state)
  Arena arena_;                    // on the parameters' backend
  Tensor m_, v_;                   // [the parts' elements] each: the parts end to end
};

}  // namespace bottle
