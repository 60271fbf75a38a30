#include "train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace bottle {

float LrSchedule::at(int64_t step) const {
  if (step < warmup_steps) return lr * float(step + 1) / float(warmup_steps);
  if (decay == LrDecay::constant) return lr;
  const int64_t span = std::max<int64_t>(1, total_steps - warmup_steps - 1);
  const double progress = std::clamp(double(step - warmup_steps) / double(span), 0.0, 1.0);
  const double shape =
      decay == LrDecay::linear ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  const double min_lr = double(lr) * min_lr_ratio;
  return float(min_lr + (double(lr) - min_lr) * shape);
}

}  // namespace bottle
