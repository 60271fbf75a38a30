#pragma once
// Learning rate at a step: linear warmup from lr/warmup to lr, then cosine / linear decay to
// min_lr_ratio·lr at the last step, or constant.
#include <array>
#include <cstdint>

namespace bottle {

// What the rate does after warmup (lr_scheduler.decay).
enum class LrDecay { cosine, linear, constant };
// The TOML spelling of each LrDecay, in the enum's order: the one table the configuration
// parses lr_scheduler.decay with and prints it from.
inline constexpr std::array<const char*, 3> kLrDecayNames = {"cosine", "linear", "constant"};

// From optimizer.lr, lr_scheduler.* and training.steps; their defaults are the
// configuration's (train/train_config.h), so none here.
struct LrSchedule {
  float lr{};
  int64_t warmup_steps{};
  int64_t total_steps{};
  LrDecay decay{};
  float min_lr_ratio{};

  // step is 0-based: the rate used for the update that ends step `step` + 1.
  float at(int64_t step) const;
};

}  // namespace bottle
