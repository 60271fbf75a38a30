#include "plan/dry_run.h"

#include "parallel/recompute.h"
#include "train/memory_plan.h"
#include "train/train_step.h"

namespace bottle {

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
