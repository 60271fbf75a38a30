#pragma once
// A rank's memory before any of it is allocated: the model laid out in reserve (exact
// buffer sizes, no memory used), plus the optimizer's moments, ZeRO-1's scratch and the
// token batches. training.memory_limit refuses a layout whose plan does not fit.
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/llama.h"
#include "train/train_config.h"

namespace bottle {

// This rank's footprint when training `config` as `stage` of the pipeline with `tp`,
// `slots` micro-batches in flight.
MemoryBreakdown plan_rank_memory(const TrainConfig& config, const TensorParallel& tp,
                                 const PipelineStage& stage, int slots);

// "weights 1.25 GiB, gradients …, optimizer …, activations …, comm …, workspace …".
std::string describe_memory(const MemoryBreakdown& m);

// Every rank's `sizes` (the same count on each), exactly, in world rank order.
std::vector<std::vector<size_t>> gather_sizes(Communicator& world, std::span<const size_t> sizes);

// Fails on every rank of `world` when some rank's plan exceeds training.memory_limit (0: no
// limit), naming the key, the limit and the largest rank's plan.
void check_memory_limit(const TrainConfig& config, const MemoryBreakdown& plan, Communicator& world,
                        const std::string& config_path);

}  // namespace bottle
