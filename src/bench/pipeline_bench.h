#pragma once
// `bottle bench pipeline`: the training step of `bottle train` (train/train_step.h) on the
// configuration's tp x pp x dp layout (under mpirun), each pipeline schedule of the registry
// that the model runs (schedule_runnable) side by side, for the full-rank model and the
// configuration's bottleneck model of the same widths: the step's time, the measured pipeline
// bubble (the share of the schedule's time a stage waits instead of computing, against the
// ideal: the replay of the schedule's lists with unit costs, bubble_fraction, which is
// (p-1)/(m+p-1) for 1f1b and gpipe) and the gradient traffic each DP rank all-reduces per step.
#include <string>

#include "train/train_config.h"

namespace bottle {

struct BenchPipelineOptions {
  std::string config_path;  // the file the configuration came from, for the first line
  int steps = 3, warmup = 1;
};

// Times every runnable schedule for each model on the world communicator (parallel.tp x pp x dp
// ranks) and prints a line per model and schedule on the first rank.
void run_bench_pipeline(const TrainConfig& config, const BenchPipelineOptions& options);

}  // namespace bottle
