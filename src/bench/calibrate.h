#pragma once
// `bottle plan --calibrate FILE`: this machine as a cluster file (plan/cluster.h), measured.
#include <string>

#include "comm/communicator.h"

namespace bottle {

// Measures, on every rank of `world` at once with this process's OpenMP threads: the GEMM rate
// of a square product of 1024 in fp32 and bf16, the memory bandwidth of a large copy, the rate
// thin GEMMs stream their operands at, causal attention's rate,
// one small kernel's cost (the per-kernel overhead), and all-reduces of a small and a large
// buffer over the world (a ring's per-step latency and bandwidth). Each figure is the median
// of several timings, the slowest rank's, written to `path` (rank 0) with both efficiency
// constants 1: every rate is one reached here. Needs at least two ranks, whose collectives it
// measures.
void calibrate_cluster(Communicator& world, const std::string& path);

}  // namespace bottle
