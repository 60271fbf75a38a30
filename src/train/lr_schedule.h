#pragma once
// Learning rate at a step: linear warmup from lr/warmup to lr, then cosine / linear decay to
// min_lr_ratio·lr at the last step, or constant.
#include <cstdint>
#include <string>

namespace bottle {

// From optimizer.lr, lr_scheduler.* and training.steps; their defaults are the
// configuration's (train/train_config.h), so none here.
struct LrSchedule {
  float lr{};
  int64_t warmup_steps{};
  int64_t total_steps{};
  std::string decay;  // cosine | linear | constant
  float min_lr_ratio{};

  // step is 0-based: the rate used for the update that ends step `step` + 1.
  float at(int64_t step) const;
};

}  // namespace bottle
