#pragma once
// Learning rate at a step: linear warmup from lr/warmup to lr, then cosine / linear decay to
// min_lr_ratio·lr at the last step, or constant.
#include <cstdint>
#include <string>

namespace bottle {

struct LrSchedule {
  float lr = 3e-4f;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  std::string decay = "cosine";  // cosine | linear | constant
  float min_lr_ratio = 0.1f;

  // step is 0-based: the rate used for the update that ends step `step` + 1.
  float at(int64_t step) const;
};

}  // namespace bottle
