#include "pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <set>
#include <utility>

#include "core/error.h"
#include "pipeline/schedule_replay.h"

namespace bottle {
namespace {

// Where a chunk's messages go. Rank r's chunk c is virtual stage c·stages + r (Megatron-LM's
// interleaving), so its activation goes to rank r + 1's chunk c, or from the last rank to
// rank 0's chunk c + 1; the first virtual stage receives nothing, the last sends nothing.
struct Layout {
  int stages, stage, chunks;
  bool first(int c) const { return stage == 0 && c == 0; }
  bool last(int c) const { return stage == stages - 1 && c == chunks - 1; }
  std::pair<int, int> previous(int c) const {  // (rank, chunk) before (stage, c)
    return stage > 0 ? std::pair{stage - 1, c} : std::pair{stages - 1, c - 1};
  }
  std::pair<int, int> next(int c) const {  // (rank, chunk) after (stage, c)
    return stage + 1 < stages ? std::pair{stage + 1, c} : std::pair{0, c + 1};
  }
};

Action transfer(ActionKind kind, int m, int chunk, std::pair<int, int> peer) {
  return {.kind = kind,
          .micro_batch = m,
          .chunk = chunk,
          .peer = peer.first,
          .peer_chunk = peer.second};
}

Action compute(int m, int chunk, Pass pass) {
  return {.kind = ActionKind::compute, .micro_batch = m, .chunk = chunk, .pass = pass};
}

// A forward with its receive before and its send after. With one stage (and several chunks)
// the neighbouring chunk is on this rank and the list's order alone carries the data.
void add_forward(std::vector<Action>& out, const Layout& l, int m, int c) {
  const bool alone = l.stages == 1;
  if (!l.first(c) && !alone)
    out.push_back(transfer(ActionKind::recv_activation, m, c, l.previous(c)));
  out.push_back(compute(m, c, Pass::F));
  if (!l.last(c) && !alone) out.push_back(transfer(ActionKind::send_activation, m, c, l.next(c)));
}

// A backward pass that produces ∂/∂input (BW, or B) with its receive before and its send after;
// W has neither.
void add_backward(std::vector<Action>& out, const Layout& l, int m, int c, Pass pass) {
  const bool alone = l.stages == 1;
  if (pass == Pass::W) {
    out.push_back(compute(m, c, pass));
    return;
  }
  if (!l.last(c) && !alone) out.push_back(transfer(ActionKind::recv_gradient, m, c, l.next(c)));
  out.push_back(compute(m, c, pass));
  if (!l.first(c) && !alone)
    out.push_back(transfer(ActionKind::send_gradient, m, c, l.previous(c)));
}

std::vector<Action> gpipe(int stages, int stage, int micro_batches, int) {
  const Layout l{stages, stage, 1};
  std::vector<Action> out;
  for (int m = 0; m < micro_batches; ++m) add_forward(out, l, m, 0);
  for (int m = 0; m < micro_batches; ++m) add_backward(out, l, m, 0, Pass::BW);
  return out;
}

std::vector<Action> one_f_one_b(int stages, int stage, int micro_batches, int) {
  const Layout l{stages, stage, 1};
  std::vector<Action> out;
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) add_forward(out, l, next_forward, 0);
  while (next_forward < micro_batches) {
    add_forward(out, l, next_forward++, 0);
    add_backward(out, l, next_backward++, 0, Pass::BW);
  }
  while (next_backward < micro_batches) add_backward(out, l, next_backward++, 0, Pass::BW);
  return out;
}

// Megatron-LM's forward_backward_pipelining_with_interleaving (core/pipeline_parallel/
// schedules.py): the k-th forward of a rank runs chunk (k mod p·v) / p on micro-batch
// (k / p·v)·p + k mod p, so micro-batches go through the chunks in groups of p; the k-th
// backward runs the chunks in reverse (v − 1 − that chunk) on the same micro-batches.
// Warm-up: (p − rank − 1)·2 + (v − 1)·p forwards (all of them when m = p, as Megatron does),
// then one forward and one backward, then the remaining backwards.
std::vector<Action> interleaved_1f1b(int stages, int stage, int micro_batches, int chunks) {
  const Layout l{stages, stage, chunks};
  const int group = stages * chunks, total = micro_batches * chunks;
  auto chunk_of = [&](int k, bool forward) {
    const int c = (k % group) / stages;
    return forward ? c : chunks - 1 - c;
  };
  auto micro_batch_of = [&](int k) { return (k / group) * stages + k % stages; };
  const int warmup = micro_batches == stages
                         ? total
                         : std::min(total, (stages - stage - 1) * 2 + (chunks - 1) * stages);
  std::vector<Action> out;
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward)
    add_forward(out, l, micro_batch_of(next_forward), chunk_of(next_forward, true));
  while (next_forward < total) {
    add_forward(out, l, micro_batch_of(next_forward), chunk_of(next_forward, true));
    ++next_forward;
    add_backward(out, l, micro_batch_of(next_backward), chunk_of(next_backward, false), Pass::BW);
    ++next_backward;
  }
  for (; next_backward < total; ++next_backward)
    add_backward(out, l, micro_batch_of(next_backward), chunk_of(next_backward, false), Pass::BW);
  return out;
}

// ZB-H1 (Qi et al., §3.1; the order of the "ZB-H1" figure): at step x stage i runs F of
// micro-batch x, B of x − (p − 1 − i) and W of x − (p − 1), each where it exists. So the
// warm-up is 1F1B's (p − 1 − i forwards), the steady state runs F, B, W, the B of a
// micro-batch leaves as early as 1F1B's backward would start, and each stage's last i W passes
// fill the cool-down, where 1F1B's stages wait for gradients. F to B keeps 1F1B's
// p − i micro-batches; F to W at most p on every stage (1F1B's peak, stage 0's).
std::vector<Action> zb_h1(int stages, int stage, int micro_batches, int) {
  const Layout l{stages, stage, 1};
  std::vector<Action> out;
  for (int x = 0; x < micro_batches + stages - 1; ++x) {
    if (x < micro_batches) add_forward(out, l, x, 0);
    const int b = x - (stages - 1 - stage), w = x - (stages - 1);
    if (b >= 0 && b < micro_batches) add_backward(out, l, b, 0, Pass::B);
    if (w >= 0 && w < micro_batches) add_backward(out, l, w, 0, Pass::W);
  }
  return out;
}

constexpr std::array<ScheduleInfo, 4> kSchedules = {{
    {PipelineSchedule::one_f_one_b, "1f1b", false, false,
     "one forward, one backward: at most stages − stage micro-batches alive", one_f_one_b},
    {PipelineSchedule::gpipe, "gpipe", false, false,
     "every forward, then every backward: all micro-batches alive", gpipe},
    {PipelineSchedule::interleaved_1f1b, "interleaved_1f1b", true, false,
     "Megatron-LM's interleaved 1F1B over parallel.virtual_stages chunks per stage: the "
     "bubble shrinks that many times; training.grad_accum_steps a multiple of parallel.pp",
     interleaved_1f1b},
    {PipelineSchedule::zb_h1, "zb_h1", false, true,
     "ZB-H1 (zero bubble): 1F1B with the weight gradients (W) deferred into the cool-down", zb_h1},
}};

}  // namespace

std::span<const ScheduleInfo> schedules() { return kSchedules; }

const ScheduleInfo& schedule_info(PipelineSchedule schedule) {
  const ScheduleInfo& info = kSchedules[size_t(schedule)];
  BOTTLE_ASSERT(info.id == schedule, "the schedule registry is out of PipelineSchedule's order");
  return info;
}

const char* schedule_name(PipelineSchedule schedule) { return schedule_info(schedule).name; }

std::string schedule_shape_error(PipelineSchedule schedule, int stages, int64_t micro_batches,
                                 int virtual_stages) {
  if (stages < 1 || micro_batches < 1 || virtual_stages < 1)
    return fmt::format("{} stages, {} micro-batches and {} chunks per stage: each must be >= 1",
                       stages, micro_batches, virtual_stages);
  const ScheduleInfo& info = schedule_info(schedule);
  if (!info.needs_virtual_stages && virtual_stages != 1)
    return fmt::format("{} runs one chunk per stage, not {}", info.name, virtual_stages);
  if (schedule == PipelineSchedule::interleaved_1f1b && micro_batches % stages != 0)
    return fmt::format(
        "{} runs micro-batches in groups of one per stage: {} micro-batches do not split into "
        "groups of {} stages",
        info.name, micro_batches, stages);
  return {};
}

std::vector<Action> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches, int virtual_stages) {
  const std::string error = schedule_shape_error(schedule, stages, micro_batches, virtual_stages);
  BOTTLE_ASSERT(error.empty() && stage >= 0 && stage < stages,
                "pipeline schedule: stage {} of {}: {}", stage, stages, error);
  return schedule_info(schedule).generate(stages, stage, micro_batches, virtual_stages);
}

std::vector<std::vector<Action>> pipeline_schedules(PipelineSchedule schedule, int stages,
                                                    int micro_batches, int virtual_stages) {
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s)
    lists.push_back(pipeline_schedule(schedule, stages, s, micro_batches, virtual_stages));
  return lists;
}

int peak_in_flight(const std::vector<Action>& actions) {
  std::set<std::pair<int, int>> alive;  // (micro-batch, chunk) between F and W (or BW)
  size_t peak = 0;
  for (const Action& a : actions) {
    if (a.kind != ActionKind::compute) continue;
    if (a.pass == Pass::F) {
      alive.insert({a.micro_batch, a.chunk});
      peak = std::max(peak, alive.size());
    }
    if (a.pass == Pass::W || a.pass == Pass::BW) alive.erase({a.micro_batch, a.chunk});
  }
  return int(peak);
}

double bubble_fraction(PipelineSchedule schedule, int stages, int micro_batches,
                       int virtual_stages) {
  const double v = virtual_stages;
  const PassCosts unit{
      .forward = 1 / v, .backward_input = 1 / v, .backward_weight = 1 / v, .backward = 2 / v};
  return replay_schedule(pipeline_schedules(schedule, stages, micro_batches, virtual_stages), unit)
      .bubble_fraction();
}

std::string to_string(const Action& a) {
  constexpr const char* transfers[] = {"recv_activation", "", "send_activation", "recv_gradient",
                                       "send_gradient"};
  constexpr const char* passes[] = {"forward", "backward_input", "backward_weight", "backward"};
  const char* name = a.kind == ActionKind::compute ? passes[int(a.pass)] : transfers[int(a.kind)];
  if (a.chunk == 0) return fmt::format("{}({})", name, a.micro_batch);
  return fmt::format("{}({}, chunk {})", name, a.micro_batch, a.chunk);
}

}  // namespace bottle
