// Pipeline schedules on their own: the order of each stage's actions, how many
// micro-batches each keeps alive, and that every stage finishes when sends never block and
// receives wait for their message (the executor's semantics): no deadlock by construction.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>

#include "pipeline/schedule.h"

namespace bottle {
namespace {

using K = ActionKind;

struct Params {
  PipelineSchedule schedule;
  int stages, micro_batches;
};

class Schedules : public ::testing::TestWithParam<Params> {};

// Runs every stage's list; a receive proceeds only once the neighbour has issued the send.
// Returns false on a deadlock (no stage can move and some are unfinished).
bool simulate(const std::vector<std::vector<Action>>& lists) {
  const int stages = int(lists.size());
  std::vector<size_t> pc(size_t(stages), 0);
  // (from stage, to stage, kind, micro-batch) messages sent so far.
  std::map<std::tuple<int, int, int, int>, int> sent;
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      while (pc[s] < lists[s].size()) {
        const Action a = lists[s][pc[s]];
        if (a.kind == K::recv_activation || a.kind == K::recv_gradient) {
          const int from = a.kind == K::recv_activation ? s - 1 : s + 1;
          const int kind = a.kind == K::recv_activation ? 0 : 1;
          auto it = sent.find({from, s, kind, a.micro_batch});
          if (it == sent.end() || it->second == 0) break;
          --it->second;
        } else if (a.kind == K::send_activation) {
          ++sent[{s, s + 1, 0, a.micro_batch}];
        } else if (a.kind == K::send_gradient) {
          ++sent[{s, s - 1, 1, a.micro_batch}];
        }
        ++pc[s];
        moved = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s)
    if (pc[s] != lists[s].size()) return false;
  for (const auto& [key, count] : sent)
    if (count != 0) return false;  // a message nobody received
  return true;
}

TEST_P(Schedules, EveryStageFinishesAndRunsEachMicroBatchOnce) {
  const Params p = GetParam();
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < p.stages; ++s) {
    lists.push_back(pipeline_schedule(p.schedule, p.stages, s, p.micro_batches));
    std::map<int, int> forwards, backwards;
    int last_forward = -1;
    for (const Action& a : lists.back()) {
      if (a.kind == K::forward) {
        EXPECT_EQ(a.micro_batch, last_forward + 1) << "forwards run in order";
        last_forward = a.micro_batch;
        ++forwards[a.micro_batch];
      }
      if (a.kind == K::backward) {
        EXPECT_EQ(forwards.count(a.micro_batch), 1u) << "backward before forward";
        ++backwards[a.micro_batch];
      }
    }
    EXPECT_EQ(int(forwards.size()), p.micro_batches);
    EXPECT_EQ(int(backwards.size()), p.micro_batches);
    // The first stage receives nothing from before it, the last nothing from after it.
    for (const Action& a : lists.back()) {
      if (s == 0) {
        EXPECT_NE(a.kind, K::recv_activation);
        EXPECT_NE(a.kind, K::send_gradient);
      }
      if (s == p.stages - 1) {
        EXPECT_NE(a.kind, K::send_activation);
        EXPECT_NE(a.kind, K::recv_gradient);
      }
    }
  }
  EXPECT_TRUE(simulate(lists));
}

TEST_P(Schedules, MicroBatchesAlive) {
  const Params p = GetParam();
  for (int s = 0; s < p.stages; ++s) {
    const int peak = peak_in_flight(pipeline_schedule(p.schedule, p.stages, s, p.micro_batches));
    if (p.schedule == PipelineSchedule::gpipe)
      EXPECT_EQ(peak, p.micro_batches) << "stage " << s;
    else
      EXPECT_EQ(peak, std::min(p.stages - s, p.micro_batches)) << "stage " << s;
  }
}

INSTANTIATE_TEST_SUITE_P(
    All, Schedules,
    ::testing::Values(Params{PipelineSchedule::gpipe, 1, 3}, Params{PipelineSchedule::gpipe, 2, 4},
                      Params{PipelineSchedule::gpipe, 4, 8}, Params{PipelineSchedule::gpipe, 4, 2},
                      Params{PipelineSchedule::one_f_one_b, 1, 3},
                      Params{PipelineSchedule::one_f_one_b, 2, 4},
                      Params{PipelineSchedule::one_f_one_b, 4, 8},
                      Params{PipelineSchedule::one_f_one_b, 4, 2},
                      Params{PipelineSchedule::one_f_one_b, 3, 7}),
    [](const auto& info) {
      return fmt::format("{}_{}stages_{}mb",
                         info.param.schedule == PipelineSchedule::gpipe ? "gpipe" : "1f1b",
                         info.param.stages, info.param.micro_batches);
    });

// The 1F1B order of the middle stage of 4 with 8 micro-batches, spelled out.
TEST(Schedules, OneFOneBOrder) {
  const auto a = pipeline_schedule(PipelineSchedule::one_f_one_b, 4, 2, 3);
  std::vector<std::string> got;
  for (const Action& x : a) got.push_back(to_string(x));
  const std::vector<std::string> want = {
      "recv_activation(0)", "forward(0)",  "send_activation(0)",  // warm-up: 1
      "recv_activation(1)", "forward(1)",  "send_activation(1)",  // steady: 1F
      "recv_gradient(0)",   "backward(0)", "send_gradient(0)",    //         1B
      "recv_activation(2)", "forward(2)",  "send_activation(2)",  //
      "recv_gradient(1)",   "backward(1)", "send_gradient(1)",    //
      "recv_gradient(2)",   "backward(2)", "send_gradient(2)"};   // cool-down
  EXPECT_EQ(got, want);
}

TEST(Schedules, BubbleFraction) {
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::one_f_one_b, 4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::gpipe, 1, 8), 0.0);
}

}  // namespace
}  // namespace bottle
