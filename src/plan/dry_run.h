#pragma once
// `bottle plan`'s dry run (docs/design.md §22): one optimizer step of a configuration, exactly
// as `bottle train` takes it (TrainStep: the pipeline schedule's micro-batches, the DP
// reduction, the norm, AdamW), for one rank of each pipeline stage, on the counting backend
// with counting communicators of the configuration's group sizes. Nothing is computed or
// allocated; what comes out is what the step would issue: every kernel and GEMM shape, every
// collective with its size, and the rank's memory plan.
//
// The counts are sums over the step's micro-batches, and beyond the first few every one adds
// the same: dry_run_stage runs two steps of a few micro-batches and extrapolates, so that its
// cost does not grow with training.grad_accum_steps (dry_run.cpp states when that is exact).
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "comm/counting_communicator.h"
#include "core/arena.h"
#include "backend/counting_backend.h"
#include "train/train_config.h"

namespace bottle {

// One event of a stage's timeline under parallel.tp_overlap (what `bottle plan` replays to
// price it, planner.cpp): the kernels run since the last event, a call of the TP group issued
// (started, or blocking: waited at once), or the wait for a started one.
struct TpTimelineEvent {
  enum class Kind { work, issue, wait };
  Kind kind = Kind::work;
  OpCounts work;         // work: the kernels, in any phase
  CallShape call;        // issue
  int64_t id = 0;        // issue, wait: the call's number in the timeline
  bool started = false;  // issue: a started call, waited for by a later wait event
};

// Kernels by phase: "" (the step's first pass) and kRecomputePhase (blocks recomputed in
// backward).
struct StageCounts {
  int stage = 0;
  std::map<std::string, OpCounts> ops;
  // Collectives per group kind ("tp", "pp", "dp"; the tied embedding's group counts as "pp"),
  // each call with its group size.
  std::map<std::string, std::map<CallShape, int64_t>> calls;
  MemoryBreakdown memory;  // the memory planner's plan of this rank (plan_rank_memory)
  double model_flops = 0;  // this rank's GEMM + attention FLOPs outside recomputation
  // The TP group's calls and the kernels between them, in issue order: recorded with tp > 1
  // where some TP calls are started, not blocking (parallel.tp_overlap; parallel.tp_backward =
  // "async": each input gradient's all-reduce under the weight gradient); empty otherwise.
  std::vector<TpTimelineEvent> tp_timeline;
  // The micro-batches tp_timeline covers: the step's under TP overlap (the planner replays it
  // whole), else maybe fewer (a step extrapolated from shorter ones: what the replay hides is
  // scaled to the step, as every micro-batch's backward starts the same calls).
  int64_t timeline_micro_batches = 0;
  // Times one training step made the host wait for the device (Backend::host_waits), as a
  // device backend would: the step's own waits, not those of setting it up.
  int64_t host_waits = 0;
};

// A group's calls per call site (phase included), counted as CommStats counts them: calls,
// elements and bytes (bench tp's counters, for the TP group).
std::map<std::string, CommCounter, std::less<>> calls_by_site(
    const std::map<CallShape, int64_t>& calls);
// Their sum over the sites that start with `prefix`.
CommCounter calls_with_prefix(const std::map<CallShape, int64_t>& calls, std::string_view prefix);

// The dry run of pipeline stage `stage` (tp rank 0, dp rank 0) of `config` (its parallel.tp,
// .pp, .dp, .tp_mode and training.* as they are): what dry_run_step counts, from two shorter
// steps where the counts are linear in the micro-batches.
StageCounts dry_run_stage(const TrainConfig& config, int stage);

// The same from one step of every micro-batch, as `bottle train` takes it; `laid_out`, when
// given, receives what that step's own buffers took (the tags the memory planner plans).
StageCounts dry_run_step(const TrainConfig& config, int stage, MemoryBreakdown* laid_out = nullptr);

}  // namespace bottle
