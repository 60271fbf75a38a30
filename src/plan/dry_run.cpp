#include "plan/dry_run.h"

#include <optional>
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

}  // namespace

StageCounts dry_run_stage(const TrainConfig& config, int stage) {
  const ParallelConfig& p = config.parallel;
  StageCounts out;
  out.stage = stage;
  // The one split a training step makes: the tied embedding's group of the first and the
  // last stage (TrainStep), which every other stage leaves.
  const int pp = p.pp;
  auto tied_split = [pp](int color, int key) {
    using Group = CountingCommunicator::SplitGroup;
    return color == 0 ? Group{2, key == 0 ? 0 : 1, 0, pp - 1}
                      : Group{pp - 2, std::max(0, key - 1), 1, 1};
  };
  CountingCommunicator tp("tp", p.tp, 0), dp("dp", p.dp, 0), pipe("pp", pp, stage, tied_split);
  CountingBackend be;
  // Recomputation shows in the TP group's phase (CommPhase), which the model sets also on a
  // group of one rank.
  be.set_phase_source(&tp.stats().phase());
  std::optional<TimelineRecorder> timeline;
  if (p.tp_overlap && p.tp > 1) timeline.emplace(be, tp, out.tp_timeline);
  {
    TrainStep step(bench_step_config(config), be, tensor_parallel_of(config, &tp),
                   pp > 1 ? &pipe : nullptr, p.dp > 1 ? &dp : nullptr);
    step.allocate_activations();
    out.step_memory = step.model().memory();
    out.step_memory[MemoryTag::optimizer] = step.optimizer().bytes();
    const int64_t waits_before = be.host_waits();
    step.step(0);
    out.host_waits = be.host_waits() - waits_before;
  }
  if (timeline) {
    timeline->flush();
    timeline.reset();
  }
  out.ops = be.counts();
  out.calls["tp"] = tp.calls();
  out.calls["pp"] = pipe.calls();
  out.calls["dp"] = dp.calls();
  out.tp_stats = tp.stats();
  const auto first = out.ops.find("");
  if (first != out.ops.end()) out.model_flops = first->second.flops();
  out.memory = plan_rank_memory(config, tensor_parallel_of(config, &tp), PipelineStage{pp, stage},
                                pipeline_slots(config, stage));
  return out;
}

}  // namespace bottle
