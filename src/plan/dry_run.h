#pragma once
// `bottle plan`'s dry run (docs/design.md §22): one optimizer step of a configuration, exactly
// as `bottle train` takes it (TrainStep: the pipeline schedule's micro-batches, the DP
// reduction, the norm, AdamW), for one rank of each pipeline stage, on the counting backend
// with counting communicators of the configuration's group sizes. Nothing is computed or
// allocated; what comes out is what the step would issue: every kernel and GEMM shape, every
// collective with its size, and the rank's memory plan.
#include <map>
#include <string>

#include "comm/counting_communicator.h"
#include "core/arena.h"
#include "backend/counting_backend.h"
#include "train/train_config.h"

namespace bottle {

// Kernels by phase: "" (the step's first pass) and kRecomputePhase (blocks recomputed in
// backward).
struct StageCounts {
  int stage = 0;
  std::map<std::string, OpCounts> ops;
  // Collectives per group kind ("tp", "pp", "dp"; the tied embedding's group counts as "pp"),
  // each call with its group size.
  std::map<std::string, std::map<CallShape, int64_t>> calls;
  CommStats tp_stats;           // the TP group's counters per call site, as bench tp reads them
  MemoryBreakdown memory;       // the memory planner's plan of this rank (plan_rank_memory)
  MemoryBreakdown step_memory;  // what the dry run's own TrainStep laid out, the same tags
  double model_flops = 0;       // this rank's GEMM + attention FLOPs outside recomputation
  // Times one training step made the host wait for the device (Backend::host_waits), as a
  // device backend would: the step's own waits, not those of setting it up.
  int64_t host_waits = 0;
};

// The dry run of pipeline stage `stage` (tp rank 0, dp rank 0) of `config` (its parallel.tp,
// .pp, .dp, .tp_mode and training.* as they are).
StageCounts dry_run_stage(const TrainConfig& config, int stage);

}  // namespace bottle
