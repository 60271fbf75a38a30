#pragma once
// `bottle bench tp`: the three tensor-parallel modes on the same model, side by side in one
// run (under mpirun -np t): full-rank Megatron TP on the full-rank model of the same widths,
// vanilla low-rank TP and BTP on the bottleneck model. Per mode: the communicator's exact
// per-block volumes and collective counts, and the training step's time split into
// communication and compute, tokens/s and memory per rank by tag; with --json one TpRow per
// mode and variant (bench/results.h).
#include <cstdint>
#include <string>

#include "train/train_config.h"

namespace bottle {

struct BenchTpOptions {
  std::string config_path;  // the file the configuration came from, for the messages
  // Whether --set gave training.recompute (a message then blames --set, not the file).
  bool recompute_from_set = false;
  int steps = 5, warmup = 2;
  int threads = 0;  // OpenMP threads per rank; 0: the cores over the ranks
  bool json = false;
  bool variants = false;    // also grouping switched and btp's norm statistic all-reduced
  bool recompute = false;   // also every other recompute policy of each mode
  bool components = false;  // the q/k/v and gate/up groups' compute and all-reduce apart
  bool tp_overlap = false;  // also each mode with parallel.tp_overlap
  bool tp_backward = false;  // also each mode with the other parallel.tp_backward
  // --fit: plan, without timing, the largest micro-batch (up to fit_max) under this many
  // bytes per rank ("80GiB"); empty: time the modes.
  std::string fit;
  int64_t fit_max = 64;
};

// Runs the bench on the world communicator (one TP group: parallel.pp = parallel.dp = 1) and
// prints its table, or its rows as JSON, on the first rank.
void run_bench_tp(const TrainConfig& config, const BenchTpOptions& options);

}  // namespace bottle
