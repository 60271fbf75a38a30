#include "plan/dry_run.h"

#include <optional>
#include <set>
#include <utility>

#include "parallel/recompute.h"
#include "train/memory_plan.h"
#include "train/train_step.h"

namespace bottle {
namespace {

// Records the TP group's calls and the kernels between them (StageCounts::tp_timeline): the
// backend counts every kernel into `work_` as well, which becomes one event at each call.
class TimelineRecorder final : public CallTimeline {
 public:
  TimelineRecorder(CountingBackend& be, CountingCommunicator& tp,
                   std::vector<TpTimelineEvent>& events)
      : be_(be), tp_(tp), events_(events) {
    be_.set_segment(&work_);
    tp_.set_timeline(this);
  }
  ~TimelineRecorder() override {
    be_.set_segment(nullptr);
    tp_.set_timeline(nullptr);
  }
  TimelineRecorder(const TimelineRecorder&) = delete;
  TimelineRecorder& operator=(const TimelineRecorder&) = delete;

  void issued(const CallShape& call, int64_t id, bool started) override {
    flush();
    events_.push_back({TpTimelineEvent::Kind::issue, {}, call, id, started});
  }
  void waited(int64_t id) override {
    flush();
    events_.push_back({TpTimelineEvent::Kind::wait, {}, {}, id, false});
  }
  // The kernels since the last event, as one; called at each event and at the end.
  void flush() {
    if (work_.gemms.empty() && work_.kernels.empty()) return;
    events_.push_back({TpTimelineEvent::Kind::work, std::exchange(work_, {}), {}, 0, false});
  }

 private:
  CountingBackend& be_;
  CountingCommunicator& tp_;
  std::vector<TpTimelineEvent>& events_;
  OpCounts work_;
};

// With tp > 1 and started TP calls (TP overlap's, or the async TP backward's) the dry run
// records the TP group's timeline, which the planner replays.
bool records_timeline(const TrainConfig& config) {
  const ParallelConfig& p = config.parallel;
  return p.tp > 1 && (p.tp_overlap || p.tp_backward == TpBackward::async);
}

// One step of `config`'s micro-batches on stage `stage`: its counts without the memory plan,
// and in `laid_out`, when given, what the step's own buffers took.
StageCounts count_step(const TrainConfig& config, int stage, MemoryBreakdown* laid_out) {
  const ParallelConfig& p = config.parallel;
  StageCounts out;
  out.stage = stage;
  const int pp = p.pp;
  CountingCommunicator tp("tp", p.tp, 0), dp("dp", p.dp, 0),
      pipe("pp", pp, stage, tied_embedding_split(pp));
  CountingBackend be;
  // Recomputation shows in the TP group's phase (CommPhase), which the model sets also on a
  // group of one rank.
  be.set_phase_source(&tp.stats().phase());
  std::optional<TimelineRecorder> timeline;
  if (records_timeline(config)) timeline.emplace(be, tp, out.tp_timeline);
  {
    TrainStep step(bench_step_config(config), be, tensor_parallel_of(config, &tp),
                   pp > 1 ? &pipe : nullptr, p.dp > 1 ? &dp : nullptr);
    step.allocate_activations();
    if (laid_out) {
      *laid_out = step.model().memory();
      (*laid_out)[MemoryTag::optimizer] = step.optimizer().bytes();
    }
    const int64_t waits_before = be.host_waits();
    step.step(0);
    out.host_waits = be.host_waits() - waits_before;
  }
  if (timeline) {
    timeline->flush();
    timeline.reset();
    out.timeline_micro_batches = config.training.grad_accum_steps;
  }
  out.ops = be.counts();
  out.calls["tp"] = tp.calls();
  out.calls["pp"] = pipe.calls();
  out.calls["dp"] = dp.calls();
  return out;
}

// The micro-batches stage `stage` keeps in flight (pipeline_slots), without listing a long
// step's schedule: GPipe keeps every one, 1F1B at most pp − stage (pipeline/schedule.h).
int64_t slots_in_flight(const TrainConfig& config, int stage) {
  const int64_t m = config.training.grad_accum_steps;
  if (m <= 64) return pipeline_slots(config, stage);
  return config.parallel.schedule == PipelineSchedule::gpipe
             ? m
             : std::min<int64_t>(config.parallel.pp - stage, m);
}

// The memory planner's plan of the stage (plan_rank_memory). It lays out every slot's
// activations, the same buffers in each (every allocation rounded alike), beside what the slots
// share: from a few slots on one more adds the same bytes, so a plan of many (GPipe keeps
// every micro-batch of the step) is extrapolated from the plans of 2 and 3.
MemoryBreakdown stage_memory(const TrainConfig& config, int stage) {
  CountingCommunicator tp("tp", config.parallel.tp, 0);
  auto plan = [&](int64_t slots) {
    return plan_rank_memory(config, tensor_parallel_of(config, &tp),
                            PipelineStage{config.parallel.pp, stage}, int(slots));
  };
  const int64_t slots = slots_in_flight(config, stage);
  if (slots <= 5) return plan(slots);
  const MemoryBreakdown low = plan(2), high = plan(3);
  MemoryBreakdown out = high;
  for (size_t tag = 0; tag < out.bytes.size(); ++tag) {
    BOTTLE_ASSERT(high.bytes[tag] >= low.bytes[tag], "a memory plan shrinks with more slots");
    out.bytes[tag] += size_t(slots - 3) * (high.bytes[tag] - low.bytes[tag]);
  }
  BOTTLE_ASSERT(high.attention == low.attention, "attention's workspace grows with the slots");
  return out;
}

// The first pass's FLOPs and the memory plan: what a dry run adds to the step's counts.
void complete(StageCounts& counts, const TrainConfig& config, int stage) {
  // A split backward's W pass is first-pass work too.
  for (const char* phase : {"", kWeightPassPhase})
    if (const auto it = counts.ops.find(phase); it != counts.ops.end())
      counts.model_flops += it->second.flops();
  counts.memory = stage_memory(config, stage);
}

// The micro-batches from which on each one more adds the same counts to a step of this stage.
// A step's first micro-batch differs from the rest (its backward writes the gradients the
// others add to) and so does its last (whose backward starts the DP buckets): steps of 2 and 3
// micro-batches differ by one in the middle, as do any two steps of k and k + 1 ≥ 3, whatever
// order the schedule runs them in. The exception is ZeRO-3, which keeps the last two units it
// gathered and gathers again only what it lacks, so a pass's gathers depend on the pass
// before: a forward after a forward gathers every unit, after a backward all but two. GPipe
// runs every forward, then every backward, so one more micro-batch is one more of each
// (F→F, B→B); 1F1B runs pp − s − 1 forwards on stage s before its first backward, and from
// m = pp − s on one more micro-batch is one more forward–backward pair in the middle
// (B→F, F→B), which gathers four units fewer than F→F with B→B.
// Planner.ExtrapolatesTheMicroBatchesExactly holds every TP mode, ZeRO level, overlap,
// schedule, policy and stage to it against the step of every micro-batch.
int64_t linear_from(const TrainConfig& config, int stage) {
  const ParallelConfig& p = config.parallel;
  if (p.zero >= 3 && p.dp > 1 && p.pp > 1 && p.schedule == PipelineSchedule::one_f_one_b)
    return std::max<int64_t>(2, p.pp - stage);
  return 2;
}

// high + times · (high − low) for one counter: `times` micro-batches past the step `high`,
// where `low` is the step of one micro-batch fewer. Every counter is a whole number (FLOPs and
// bytes too, which the backend sums call by call), so below 2^53 this is exactly the sum the
// longer step adds up.
int64_t extrapolated(int64_t low, int64_t high, int64_t times) {
  const int64_t r = high + times * (high - low);
  BOTTLE_ASSERT(r >= 0, "a dry run's count falls with more micro-batches: {} then {}", low, high);
  return r;
}
double extrapolated(double low, double high, int64_t times) {
  return high + double(times) * (high - low);
}
KernelCount extrapolated(const KernelCount& low, const KernelCount& high, int64_t times) {
  return {extrapolated(low.calls, high.calls, times), extrapolated(low.flops, high.flops, times),
          extrapolated(low.bytes, high.bytes, times)};
}
bool counts_nothing(int64_t n) { return n == 0; }
bool counts_nothing(const KernelCount& k) { return k.calls == 0; }

// Every key of either map, its counter extrapolated; a key that comes to nothing is left out,
// as a step that never counts it has none.
template <typename Map>
Map extrapolated(const Map& low, const Map& high, int64_t times) {
  using Value = typename Map::mapped_type;
  Map out;
  auto put = [&](const auto& key, const Value& l, const Value& h) {
    const Value r = extrapolated(l, h, times);
    if (!counts_nothing(r)) out.emplace(key, r);
  };
  for (const auto& [key, h] : high) {
    const auto it = low.find(key);
    put(key, it == low.end() ? Value{} : it->second, h);
  }
  for (const auto& [key, l] : low)
    if (!high.count(key)) put(key, l, Value{});
  return out;
}

StageCounts extrapolated(const StageCounts& low, const StageCounts& high, int64_t times) {
  StageCounts out;
  std::set<std::string> phases;
  for (const auto* counts : {&low, &high})
    for (const auto& [phase, ops] : counts->ops) phases.insert(phase);
  for (const std::string& phase : phases) {
    const auto l = low.ops.find(phase), h = high.ops.find(phase);
    const OpCounts none;
    const OpCounts& lo = l == low.ops.end() ? none : l->second;
    const OpCounts& hi = h == high.ops.end() ? none : h->second;
    out.ops[phase] = {extrapolated(lo.gemms, hi.gemms, times),
                      extrapolated(lo.kernels, hi.kernels, times)};
  }
  for (const char* group : {"tp", "pp", "dp"})
    out.calls[group] = extrapolated(low.calls.at(group), high.calls.at(group), times);
  out.host_waits = extrapolated(low.host_waits, high.host_waits, times);
  return out;
}

}  // namespace

std::map<std::string, CommCounter, std::less<>> calls_by_site(
    const std::map<CallShape, int64_t>& calls) {
  std::map<std::string, CommCounter, std::less<>> sites;
  for (const auto& [call, n] : calls) {
    CommCounter& c = sites[call.site];
    c.calls += n;
    c.elements += n * call.elements;
    c.bytes += n * call.elements * int64_t(call.element_bytes);
  }
  return sites;
}

CommCounter calls_with_prefix(const std::map<CallShape, int64_t>& calls, std::string_view prefix) {
  CommCounter sum;
  for (const auto& [call, n] : calls) {
    if (!std::string_view(call.site).starts_with(prefix)) continue;
    sum.calls += n;
    sum.elements += n * call.elements;
    sum.bytes += n * call.elements * int64_t(call.element_bytes);
  }
  return sum;
}

StageCounts dry_run_step(const TrainConfig& config, int stage, MemoryBreakdown* laid_out) {
  StageCounts out = count_step(config, stage, laid_out);
  complete(out, config, stage);
  return out;
}

StageCounts dry_run_stage(const TrainConfig& config, int stage) {
  const int64_t m = config.training.grad_accum_steps;
  const int64_t from = linear_from(config, stage);
  // The two shorter steps run 2·from + 1 micro-batches: worth it where the whole step runs more.
  // TP overlap's timeline is replayed whole.
  if ((records_timeline(config) && config.parallel.tp_overlap) || m <= 2 * from + 1)
    return dry_run_step(config, stage);
  TrainConfig shorter = config;
  shorter.training.grad_accum_steps = from;
  const StageCounts low = count_step(shorter, stage, nullptr);
  shorter.training.grad_accum_steps = from + 1;
  const StageCounts high = count_step(shorter, stage, nullptr);
  StageCounts out = extrapolated(low, high, m - from - 1);
  out.stage = stage;
  out.tp_timeline = low.tp_timeline;
  out.timeline_micro_batches = low.timeline_micro_batches;
  complete(out, config, stage);
  return out;
}

}  // namespace bottle
