// Pipeline schedules on their own: the order of each stage's actions, how many
// micro-batches each keeps alive, that every stage finishes when sends never block and
// receives wait for their message (the executor's semantics, replayed by schedule_replay.h),
// and the bubble the replay gives against the closed forms.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

#include "core/error.h"
#include "pipeline/schedule.h"
#include "pipeline/schedule_replay.h"

namespace bottle {
namespace {

using K = ActionKind;

// Every registered schedule at every shape the tests cover: stages p ∈ {1, 2, 3, 4, 8},
// micro-batches m ∈ {p, 2p, 8} and chunks v ∈ {1, 2, 3}, where the schedule takes the shape
// (interleaved_1f1b's generator also runs v = 1, which the configuration refuses).
struct Shape {
  PipelineSchedule schedule;
  int stages, micro_batches, chunks;
};

std::vector<Shape> shapes() {
  std::vector<Shape> out;
  for (const ScheduleInfo& info : schedules())
    for (int p : {1, 2, 3, 4, 8})
      for (int m : {p, 2 * p, 8})
        for (int v : {1, 2, 3}) {
          if (!schedule_shape_error(info.id, p, m, v).empty()) continue;
          const bool seen = std::any_of(out.begin(), out.end(), [&](const Shape& s) {
            return s.schedule == info.id && s.stages == p && s.micro_batches == m && s.chunks == v;
          });
          if (!seen) out.push_back({info.id, p, m, v});
        }
  return out;
}

std::string shape_name(const Shape& s) {
  return fmt::format("{}_{}stages_{}mb_{}chunks", schedule_name(s.schedule), s.stages,
                     s.micro_batches, s.chunks);
}

// The virtual stage of rank r's chunk c: the model's order of the p·v chunks.
int virtual_stage(int stages, int stage, int chunk) { return chunk * stages + stage; }

class Schedules : public ::testing::TestWithParam<Shape> {};

// Each (micro-batch, chunk) runs F once and B and W once each (or BW once), F before B before W;
// every receive comes from the virtual stage next to it in the model's order and is received
// before the pass that reads it; the replay finishes every stage.
TEST_P(Schedules, EveryStageFinishesAndRunsEachPassOnce) {
  const Shape sh = GetParam();
  const auto lists = pipeline_schedules(sh.schedule, sh.stages, sh.micro_batches, sh.chunks);
  const bool split = schedule_info(sh.schedule).splits_weight_pass;
  const int last_virtual = sh.stages * sh.chunks - 1;
  for (int s = 0; s < sh.stages; ++s) {
    SCOPED_TRACE(fmt::format("stage {}", s));
    // (micro-batch, chunk) → the passes run so far, in order; and what was received.
    std::map<std::pair<int, int>, std::string> passes;
    std::set<std::tuple<int, int, int>> received;  // (kind, micro-batch, chunk)
    for (const Action& a : lists[size_t(s)]) {
      const std::pair<int, int> key{a.micro_batch, a.chunk};
      ASSERT_GE(a.chunk, 0);
      ASSERT_LT(a.chunk, sh.chunks);
      ASSERT_GE(a.micro_batch, 0);
      ASSERT_LT(a.micro_batch, sh.micro_batches);
      const int here = virtual_stage(sh.stages, s, a.chunk);
      if (a.kind == K::compute) {
        std::string& seen = passes[key];
        switch (a.pass) {
          case Pass::F:
            EXPECT_EQ(seen, "") << to_string(a);
            if (here > 0 && sh.stages > 1)
              EXPECT_TRUE(received.count({int(K::recv_activation), a.micro_batch, a.chunk}))
                  << to_string(a) << " before its input arrived";
            seen += "F";
            break;
          case Pass::B:
            EXPECT_TRUE(split);
            EXPECT_EQ(seen, "F") << to_string(a);
            seen += "B";
            break;
          case Pass::W:
            EXPECT_TRUE(split);
            EXPECT_EQ(seen, "FB") << to_string(a);
            seen += "W";
            break;
          case Pass::BW:
            EXPECT_FALSE(split);
            EXPECT_EQ(seen, "F") << to_string(a);
            seen += "BW";
            break;
        }
        if ((a.pass == Pass::B || a.pass == Pass::BW) && here < last_virtual && sh.stages > 1)
          EXPECT_TRUE(received.count({int(K::recv_gradient), a.micro_batch, a.chunk}))
              << to_string(a) << " before its gradient arrived";
        continue;
      }
      // A transfer: its peer holds the neighbouring virtual stage.
      const bool forward_edge = a.kind == K::recv_activation || a.kind == K::send_gradient;
      const int other = virtual_stage(sh.stages, a.peer, a.peer_chunk);
      EXPECT_EQ(other, forward_edge ? here - 1 : here + 1) << to_string(a) << " peer " << a.peer;
      EXPECT_NE(a.peer, s);
      if (is_receive(a.kind))
        EXPECT_TRUE(received.insert({int(a.kind), a.micro_batch, a.chunk}).second) << to_string(a);
      if (is_send(a.kind)) {
        const std::string& seen = passes[key];
        EXPECT_EQ(seen, a.kind == K::send_activation ? "F"
                        : split                      ? "FB"
                                                     : "FBW")
            << to_string(a) << " before the pass that computes it";
      }
    }
    ASSERT_EQ(int(passes.size()), sh.micro_batches * sh.chunks);
    for (const auto& [key, seen] : passes) EXPECT_EQ(seen, "FBW") << key.first;  // F, B, W or F, BW
  }
  ReplayResult r;
  ASSERT_NO_THROW(r = replay_schedule(lists, PassCosts{}));
  // NCCL matches a pair's messages in issue order: every schedule keeps it.
  EXPECT_TRUE(r.channels_in_order);
}

// Micro-batches (× chunks) alive between F and W: 1F1B's stages − stage; GPipe all of them;
// ZB-H1 keeps 1F1B's stages − stage between F and B, and its deferred W's raise every stage to
// stage 0's peak; interleaving holds more, Megatron's warm-up + 1.
TEST_P(Schedules, MicroBatchesAlive) {
  const Shape sh = GetParam();
  const int p = sh.stages, m = sh.micro_batches, v = sh.chunks;
  for (int s = 0; s < p; ++s) {
    SCOPED_TRACE(fmt::format("stage {}", s));
    const auto list = pipeline_schedule(sh.schedule, p, s, m, v);
    const int peak = peak_in_flight(list);
    switch (sh.schedule) {
      case PipelineSchedule::gpipe:
        EXPECT_EQ(peak, m);
        break;
      case PipelineSchedule::one_f_one_b:
        EXPECT_EQ(peak, std::min(p - s, m));
        break;
      case PipelineSchedule::zb_h1: {
        EXPECT_EQ(peak, std::min(p, m));
        // Between F and B: 1F1B's count.
        std::set<int> waiting;
        size_t most = 0;
        for (const Action& a : list) {
          if (a.kind != K::compute) continue;
          if (a.pass == Pass::F) waiting.insert(a.micro_batch);
          most = std::max(most, waiting.size());
          if (a.pass == Pass::B) waiting.erase(a.micro_batch);
        }
        EXPECT_EQ(int(most), std::min(p - s, m));
        break;
      }
      case PipelineSchedule::interleaved_1f1b: {
        const int warmup = m == p ? m * v : std::min(m * v, (p - s - 1) * 2 + (v - 1) * p);
        EXPECT_EQ(peak, std::min(m * v, warmup + 1));
        if (v > 1) EXPECT_GT(peak, std::min(p - s, m));  // more than 1F1B's
        break;
      }
    }
  }
}

// The replay's bubble with unit costs against the closed forms: (p − 1)/(m + p − 1) for GPipe
// and 1F1B, (p − 1)/(v·m + p − 1) for the interleaved schedule with each chunk's passes 1/v,
// (p − 1)/(3m + p − 1) for ZB-H1 (its bubble (p − 1)(F + B − W) of the paper).
TEST_P(Schedules, BubbleAsTheory) {
  const Shape sh = GetParam();
  const double p = sh.stages, m = sh.micro_batches, v = sh.chunks;
  const double got = bubble_fraction(sh.schedule, sh.stages, sh.micro_batches, sh.chunks);
  switch (sh.schedule) {
    case PipelineSchedule::gpipe:
    case PipelineSchedule::one_f_one_b:
      EXPECT_NEAR(got, (p - 1) / (m + p - 1), 1e-12);
      break;
    case PipelineSchedule::interleaved_1f1b:
      if (sh.chunks > 1) EXPECT_NEAR(got, (p - 1) / (v * m + p - 1), 1e-12);
      break;
    case PipelineSchedule::zb_h1:
      EXPECT_NEAR(got, (p - 1) / (3 * m + p - 1), 1e-12);
      break;
  }
}

INSTANTIATE_TEST_SUITE_P(All, Schedules, ::testing::ValuesIn(shapes()),
                         [](const auto& info) { return shape_name(info.param); });

// The 1F1B order of the middle stage of 4 with 3 micro-batches, spelled out.
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
  // Today's lists: chunk 0, pass BW, the neighbours as peers.
  for (const Action& x : a) {
    EXPECT_EQ(x.chunk, 0);
    if (x.kind == K::compute) EXPECT_TRUE(x.pass == Pass::F || x.pass == Pass::BW);
    if (x.kind == K::recv_activation || x.kind == K::send_gradient) EXPECT_EQ(x.peer, 1);
    if (x.kind == K::send_activation || x.kind == K::recv_gradient) EXPECT_EQ(x.peer, 3);
  }
}

// Megatron-LM's interleaved order on rank 0 of 2 with 2 chunks and 4 micro-batches: groups of
// p = 2 micro-batches through chunk 0, then chunk 1; warm-up (2 − 0 − 1)·2 + (2 − 1)·2 = 4.
// Chunk 1's input comes from the last rank (the wrap-around) and its gradient goes back there.
TEST(Schedules, InterleavedOrder) {
  const auto a = pipeline_schedule(PipelineSchedule::interleaved_1f1b, 2, 0, 4, 2);
  std::vector<std::string> got;
  for (const Action& x : a)
    if (x.kind == K::compute) got.push_back(to_string(x));
  const std::vector<std::string> want = {
      "forward(0)",           "forward(1)",           "forward(0, chunk 1)", "forward(1, chunk 1)",
      "forward(2)",           "backward(0, chunk 1)", "forward(3)",          "backward(1, chunk 1)",
      "forward(2, chunk 1)",  "backward(0)",          "forward(3, chunk 1)", "backward(1)",
      "backward(2, chunk 1)", "backward(3, chunk 1)", "backward(2)",         "backward(3)"};
  EXPECT_EQ(got, want);
  for (const Action& x : a) {
    if (x.kind == K::recv_activation) {
      EXPECT_EQ(x.chunk, 1);
      EXPECT_EQ(x.peer, 1);
      EXPECT_EQ(x.peer_chunk, 0);  // the last rank's chunk 0 feeds rank 0's chunk 1
    }
    if (x.kind == K::send_activation) EXPECT_EQ(x.peer_chunk, x.chunk);
  }
}

// ZB-H1 on the last of 2 stages with 3 micro-batches: at step x F(x), B(x) and W(x − 1), so
// its W's lag one step and the last fills the cool-down.
TEST(Schedules, ZeroBubbleOrder) {
  std::vector<std::string> got;
  for (const Action& x : pipeline_schedule(PipelineSchedule::zb_h1, 2, 1, 3))
    if (x.kind == K::compute) got.push_back(to_string(x));
  const std::vector<std::string> want = {
      "forward(0)",        "backward_input(0)",  "forward(1)",
      "backward_input(1)", "backward_weight(0)", "forward(2)",
      "backward_input(2)", "backward_weight(1)", "backward_weight(2)"};
  EXPECT_EQ(got, want);
}

// ZB-H1's bubble against 1F1B's (the paper's (p − 1)(F + B − W) against (p − 1)(F + B + W)): the
// idle time is a third, and the idle share at most 40 % at p = 2 — at p = 4 and m = 8 it is
// 11/27 = 40.7 % (the step is shorter too), a third of the idle seconds all the same.
TEST(Schedules, ZeroBubbleAgainstOneFOneB) {
  for (auto [p, m] : {std::pair{2, 4}, std::pair{2, 8}, std::pair{4, 8}, std::pair{8, 16}}) {
    SCOPED_TRACE(fmt::format("p {} m {}", p, m));
    const ReplayResult zb =
        replay_schedule(pipeline_schedules(PipelineSchedule::zb_h1, p, m), PassCosts{});
    const ReplayResult one =
        replay_schedule(pipeline_schedules(PipelineSchedule::one_f_one_b, p, m), PassCosts{});
    double zb_idle = 0, one_idle = 0;
    for (double t : zb.idle) zb_idle += t;
    for (double t : one.idle) one_idle += t;
    EXPECT_NEAR(zb_idle, one_idle / 3, 1e-9);
    if (p == 2) EXPECT_LE(zb.bubble_fraction(), 0.4 * one.bubble_fraction());
    EXPECT_LT(zb.bubble_fraction(), 0.42 * one.bubble_fraction());
  }
}

// With balanced stages and no latency the replay of 1F1B and GPipe is the planner's old closed
// form (m + p − 1)·(F + BW); a latency between the stages only lengthens it, by at most the
// closed form's charge of one latency per message and micro-batch.
TEST(ScheduleReplay, MatchesTheClosedFormOnBalancedStages) {
  for (PipelineSchedule s : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe})
    for (auto [p, m] : {std::pair{1, 3}, std::pair{2, 4}, std::pair{4, 8}, std::pair{3, 7}}) {
      SCOPED_TRACE(fmt::format("{} p {} m {}", schedule_name(s), p, m));
      const PassCosts costs{.forward = 0.3, .backward = 0.7};
      const ReplayResult r = replay_schedule(pipeline_schedules(s, p, m), costs);
      EXPECT_NEAR(r.makespan, (m + p - 1) * 1.0, 1e-12);
      for (int st = 0; st < p; ++st) EXPECT_NEAR(r.busy[size_t(st)], m * 1.0, 1e-12);
      PassCosts slow = costs;
      slow.activation_latency = slow.gradient_latency = 0.05;
      const ReplayResult l = replay_schedule(pipeline_schedules(s, p, m), slow);
      if (p > 1) EXPECT_GT(l.makespan, r.makespan);
      EXPECT_LE(l.makespan, (m + p - 1) * (1.0 + 2 * 0.05) + 1e-12);
    }
}

// pipeline_makespan extrapolates a long step from two short replays: equal to the whole
// replay, for unequal stages with latencies, for every schedule.
TEST(ScheduleReplay, ExtrapolatesLongStepsExactly) {
  for (const ScheduleInfo& info : schedules())
    for (int p : {2, 3}) {
      const int v = info.needs_virtual_stages ? 2 : 1;
      std::vector<PassCosts> costs;
      for (int s = 0; s < p; ++s)
        costs.push_back({.forward = 0.3 + 0.1 * s,
                         .backward_input = 0.35 + 0.05 * s,
                         .backward_weight = 0.25,
                         .backward = 0.6 + 0.15 * s,
                         .activation_latency = 0.02 * (s + 1),
                         .gradient_latency = 0.03});
      for (int m : {60, 63, 90}) {
        if (!schedule_shape_error(info.id, p, m, v).empty()) continue;
        SCOPED_TRACE(fmt::format("{} p {} m {}", info.name, p, m));
        const double whole = replay_schedule(pipeline_schedules(info.id, p, m, v), costs).makespan;
        EXPECT_NEAR(pipeline_makespan(info.id, p, m, v, costs, 24), whole, 1e-9 * whole);
      }
    }
}

// The replay waits for the slowest stage: one stage twice as slow sets the pace.
TEST(ScheduleReplay, SlowestStageSetsThePace) {
  std::vector<PassCosts> costs(3, PassCosts{.forward = 1, .backward = 2});
  costs[1] = PassCosts{.forward = 2, .backward = 4};
  const auto lists = pipeline_schedules(PipelineSchedule::one_f_one_b, 3, 8);
  const ReplayResult r = replay_schedule(lists, costs);
  EXPECT_NEAR(r.busy[1], 48, 1e-12);
  EXPECT_GE(r.makespan, 48 + 1 + 2);  // stage 1 waits for stage 0's first forward and the last
                                      // backward of stage 2
  EXPECT_GT(r.idle[0], r.idle[1]);
}

// A broken list is a deadlock, named: the middle stage of three waits for a gradient before
// the activation its forward needs (its two receives swapped), so the last stage never runs.
TEST(ScheduleReplay, ReportsADeadlock) {
  auto lists = pipeline_schedules(PipelineSchedule::gpipe, 3, 1);
  std::vector<Action>& middle = lists[1];
  auto recv_activation = std::find_if(middle.begin(), middle.end(),
                                      [](const Action& a) { return a.kind == K::recv_activation; });
  auto recv_gradient = std::find_if(middle.begin(), middle.end(),
                                    [](const Action& a) { return a.kind == K::recv_gradient; });
  ASSERT_NE(recv_activation, middle.end());
  ASSERT_NE(recv_gradient, middle.end());
  ASSERT_NO_THROW(replay_schedule(lists, PassCosts{}));
  std::iter_swap(recv_activation, recv_gradient);
  try {
    replay_schedule(lists, PassCosts{});
    ADD_FAILURE() << "no deadlock reported";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("deadlock"), std::string::npos) << what;
    EXPECT_NE(what.find("stage 1 at action 0 (recv_gradient(0) from stage 2)"), std::string::npos)
        << what;
  }
  // A message sent to a stage that never receives it fails too.
  auto orphan = pipeline_schedules(PipelineSchedule::one_f_one_b, 2, 2);
  orphan[0].erase(std::find_if(orphan[0].begin(), orphan[0].end(),
                               [](const Action& a) { return a.kind == K::recv_gradient; }));
  try {
    replay_schedule(orphan, PassCosts{});
    ADD_FAILURE() << "no unreceived message reported";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("never receives it"), std::string::npos) << e.what();
  }
}

// Receives on one channel out of the order of its sends finish (they match by tag) but are
// reported: NCCL would pair them wrongly.
TEST(ScheduleReplay, ReportsReceivesOutOfSendOrder) {
  auto lists = pipeline_schedules(PipelineSchedule::gpipe, 2, 2);
  std::vector<Action>& last = lists[1];
  std::vector<size_t> receives;
  for (size_t i = 0; i < last.size(); ++i)
    if (last[i].kind == K::recv_activation) receives.push_back(i);
  ASSERT_EQ(receives.size(), 2u);
  std::swap(last[receives[0]].micro_batch, last[receives[1]].micro_batch);
  const ReplayResult r = replay_schedule(lists, PassCosts{});
  EXPECT_FALSE(r.channels_in_order);
}

TEST(Schedules, BubbleFraction) {
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::one_f_one_b, 4, 8), 3.0 / 11.0);
  EXPECT_DOUBLE_EQ(bubble_fraction(PipelineSchedule::gpipe, 1, 8), 0.0);
  EXPECT_NEAR(bubble_fraction(PipelineSchedule::interleaved_1f1b, 4, 8, 2), 3.0 / 19.0, 1e-12);
  EXPECT_NEAR(bubble_fraction(PipelineSchedule::zb_h1, 4, 8), 3.0 / 27.0, 1e-12);
}

// The registry: names in PipelineSchedule's order, each with its flags; the shapes refused.
TEST(Schedules, Registry) {
  std::vector<std::string> names;
  for (const ScheduleInfo& info : schedules()) names.emplace_back(info.name);
  EXPECT_EQ(names, (std::vector<std::string>{"1f1b", "gpipe", "interleaved_1f1b", "zb_h1"}));
  for (size_t i = 0; i < schedules().size(); ++i) EXPECT_EQ(size_t(schedules()[i].id), i);
  EXPECT_TRUE(schedule_info(PipelineSchedule::interleaved_1f1b).needs_virtual_stages);
  EXPECT_TRUE(schedule_info(PipelineSchedule::zb_h1).splits_weight_pass);
  EXPECT_FALSE(schedule_info(PipelineSchedule::one_f_one_b).splits_weight_pass);
  EXPECT_NE(schedule_shape_error(PipelineSchedule::interleaved_1f1b, 4, 6, 2), "");
  EXPECT_EQ(schedule_shape_error(PipelineSchedule::interleaved_1f1b, 4, 8, 2), "");
  EXPECT_NE(schedule_shape_error(PipelineSchedule::one_f_one_b, 4, 8, 2), "");
}

}  // namespace
}  // namespace bottle
