// The learning-rate schedule's values (docs/design.md §9): the warmup ramp, cosine and linear
// decay, the floor min_lr_ratio·lr and the edges (step 0, the end of warmup, the last step,
// steps beyond it), against values worked out by hand and against the formulas written here
// afresh, so that a change to lr_schedule.cpp cannot move both sides at once.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numbers>

#include "train/lr_schedule.h"
#include "train/train_config.h"

namespace bottle {
namespace {

// 10 warmup steps and 111 in all: the decay runs from step 10 to the last step, 110, over
// 100 steps, so step 10 + k is at progress k/100.
LrSchedule schedule(LrDecay decay, float min_lr_ratio = 0.1f) {
  return LrSchedule{.lr = 1e-3f,
                    .warmup_steps = 10,
                    .total_steps = 111,
                    .decay = decay,
                    .min_lr_ratio = min_lr_ratio};
}

// The documented schedule, in double: lr·(step+1)/warmup while warming up; then from lr at
// the first step after warmup to min_lr_ratio·lr at the last step (total_steps - 1), by half a
// cosine or a straight line, and held there after it.
double expected(const LrSchedule& s, int64_t step) {
  const double lr = s.lr, floor = lr * double(s.min_lr_ratio);
  if (step < s.warmup_steps) return lr * double(step + 1) / double(s.warmup_steps);
  if (s.decay == LrDecay::constant) return lr;
  const int64_t first = s.warmup_steps, last = s.total_steps - 1;
  // A decay of no length (the run's last step is the first after warmup, or a warmup) is at
  // the peak on that step and at the floor after it.
  const double progress = last > first ? std::min(1.0, double(step - first) / double(last - first))
                          : step > first ? 1.0
                                         : 0.0;
  const double shape = s.decay == LrDecay::linear
                           ? 1.0 - progress
                           : (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
  return floor + (lr - floor) * shape;
}

// The rate is a float computed in double: within a few float roundings of the formula.
void expect_near_rate(float actual, double want, int64_t step) {
  EXPECT_NEAR(actual, want, 1e-6 * std::fabs(want) + 1e-12) << "step " << step;
}

TEST(LrSchedule, WarmupRampsLinearlyToThePeak) {
  for (LrDecay decay : {LrDecay::cosine, LrDecay::linear, LrDecay::constant}) {
    const LrSchedule s = schedule(decay);
    EXPECT_FLOAT_EQ(s.at(0), 1e-4f);  // step 0 already takes one warmup step: lr/10
    EXPECT_FLOAT_EQ(s.at(4), 5e-4f);
    EXPECT_FLOAT_EQ(s.at(9), 1e-3f);   // the last warmup step reaches the peak
    EXPECT_FLOAT_EQ(s.at(10), 1e-3f);  // and the first decay step starts from it
  }
}

TEST(LrSchedule, CosineDecaysByHalfACosineToTheFloor) {
  const LrSchedule s = schedule(LrDecay::cosine);
  // floor 1e-4; at progress p the rate is 1e-4 + 9e-4·(1 + cos πp)/2.
  EXPECT_FLOAT_EQ(s.at(35), 1e-4f + 9e-4f * float(0.5 + std::sqrt(2.0) / 4));  // p = 1/4
  EXPECT_FLOAT_EQ(s.at(60), 5.5e-4f);                                          // p = 1/2
  EXPECT_FLOAT_EQ(s.at(85), 1e-4f + 9e-4f * float(0.5 - std::sqrt(2.0) / 4));  // p = 3/4
  EXPECT_FLOAT_EQ(s.at(110), 1e-4f);                                           // the last step
}

TEST(LrSchedule, LinearDecaysInAStraightLineToTheFloor) {
  const LrSchedule s = schedule(LrDecay::linear);
  EXPECT_FLOAT_EQ(s.at(35), 7.75e-4f);  // 1e-4 + 9e-4·3/4
  EXPECT_FLOAT_EQ(s.at(60), 5.5e-4f);
  EXPECT_FLOAT_EQ(s.at(85), 3.25e-4f);
  EXPECT_FLOAT_EQ(s.at(110), 1e-4f);
}

TEST(LrSchedule, ConstantHoldsThePeakAfterWarmup) {
  const LrSchedule s = schedule(LrDecay::constant);
  for (int64_t step : {10, 60, 110, 111, 1000}) EXPECT_EQ(s.at(step), 1e-3f) << "step " << step;
}

TEST(LrSchedule, BeyondTheLastStepTheRateStaysAtTheFloor) {
  for (LrDecay decay : {LrDecay::cosine, LrDecay::linear}) {
    const LrSchedule s = schedule(decay);
    for (int64_t step : {111, 200, 100000}) EXPECT_EQ(s.at(step), s.at(110)) << "step " << step;
  }
}

TEST(LrSchedule, TheFloorFollowsMinLrRatio) {
  EXPECT_EQ(schedule(LrDecay::cosine, 0.0f).at(110), 0.0f);
  EXPECT_EQ(schedule(LrDecay::linear, 0.0f).at(110), 0.0f);
  EXPECT_FLOAT_EQ(schedule(LrDecay::linear, 0.0f).at(60), 5e-4f);
  EXPECT_FLOAT_EQ(schedule(LrDecay::cosine, 0.5f).at(110), 5e-4f);
  // A ratio of one is a constant rate after warmup.
  for (int64_t step : {10, 60, 110})
    EXPECT_FLOAT_EQ(schedule(LrDecay::cosine, 1.0f).at(step), 1e-3f);
}

TEST(LrSchedule, WithoutWarmupStepZeroIsThePeak) {
  for (LrDecay decay : {LrDecay::cosine, LrDecay::linear}) {
    LrSchedule s = schedule(decay);
    s.warmup_steps = 0;
    s.total_steps = 101;  // decay over steps 0..100
    EXPECT_FLOAT_EQ(s.at(0), 1e-3f);
    EXPECT_FLOAT_EQ(s.at(50), 5.5e-4f);
    EXPECT_FLOAT_EQ(s.at(100), 1e-4f);
  }
}

TEST(LrSchedule, ShortRuns) {
  // A one-step run trains at the peak.
  LrSchedule one = schedule(LrDecay::cosine);
  one.warmup_steps = 0;
  one.total_steps = 1;
  EXPECT_FLOAT_EQ(one.at(0), 1e-3f);
  // Warmup as long as the run: every step warms up, the last at the peak.
  LrSchedule all_warmup = schedule(LrDecay::cosine);
  all_warmup.warmup_steps = all_warmup.total_steps = 4;
  EXPECT_FLOAT_EQ(all_warmup.at(0), 2.5e-4f);
  EXPECT_FLOAT_EQ(all_warmup.at(3), 1e-3f);
  // One step after warmup: that step is both the first and the last of the decay, at the peak.
  LrSchedule one_after = all_warmup;
  one_after.total_steps = 5;
  EXPECT_FLOAT_EQ(one_after.at(4), 1e-3f);
  EXPECT_FLOAT_EQ(one_after.at(5), 1e-4f);  // and the floor after it
  // Two steps after warmup: the peak, then the floor.
  LrSchedule two_after = all_warmup;
  two_after.total_steps = 6;
  EXPECT_FLOAT_EQ(two_after.at(4), 1e-3f);
  EXPECT_FLOAT_EQ(two_after.at(5), 1e-4f);
}

// Every step of several schedules against the formula, past the end too.
TEST(LrSchedule, EveryStepMatchesTheFormula) {
  for (LrDecay decay : {LrDecay::cosine, LrDecay::linear, LrDecay::constant})
    for (int64_t warmup : {0, 1, 7})
      for (int64_t total : {1, 2, 8, 50})
        for (float ratio : {0.0f, 0.1f, 1.0f}) {
          const LrSchedule s{.lr = 3e-4f,
                             .warmup_steps = warmup,
                             .total_steps = total,
                             .decay = decay,
                             .min_lr_ratio = ratio};
          for (int64_t step = 0; step < total + 5; ++step)
            expect_near_rate(s.at(step), expected(s, step), step);
        }
}

// The configuration reaches the schedule as it reads: lr_scheduler.decay's TOML names, the
// peak, warmup and floor, and training.steps.
TEST(LrSchedule, DecayNamesAreTheConfigurationsSpelling) {
  EXPECT_STREQ(enum_name(LrDecay::cosine), "cosine");
  EXPECT_STREQ(enum_name(LrDecay::linear), "linear");
  EXPECT_STREQ(enum_name(LrDecay::constant), "constant");
  for (const char* name : kLrDecayNames) {
    const TrainConfig c = parse_train_config_string(
        fmt::format("[lr_scheduler]\ndecay = \"{}\"\n", name), "test.toml", {});
    EXPECT_STREQ(enum_name(c.lr_scheduler.decay), name);
  }
}

}  // namespace
}  // namespace bottle
