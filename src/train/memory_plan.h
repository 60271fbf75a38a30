#pragma once
// A rank's memory before any of it is allocated: the model laid out in reserve (exact
// buffer sizes, no memory used), plus the optimizer's moments, ZeRO-1's scratch and the
// token batches. training.memory_limit refuses a layout whose plan does not fit.
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/arena.h"
#include "model/llama.h"
#include "train/train_config.h"

namespace bottle {

// Refuses a batch shape whose sizes overflow 64 bits: b·s tokens, and b·s times the widest
// activation row (vocabulary, hidden or MLP width). `where` starts the message ("FILE: key",
// "eval:"); `batch_name` and `seq_name` are the option or key names the user set.
void check_batch_shape(const ModelConfig& model, int64_t batch, int64_t seq,
                       const std::string& where, const std::string& batch_name,
                       const std::string& seq_name);

// Bytes this process can still use: MemAvailable of /proc/meminfo, lowered to what the
// cgroup's memory.max leaves (cgroup v2, or v1's limit_in_bytes); 0 when neither is known.
size_t available_memory_bytes();

// Refuses on every rank of `world` a plan the machine cannot hold: the plans of the ranks
// that share a host add up and are compared with that host's available memory. `what`
// starts the message (the config file, "eval: --checkpoint DIR", ...), `advice` ends it.
void check_available_memory(const MemoryBreakdown& plan, Communicator& world,
                            const std::string& what, const std::string& advice);

// A quick lower bound of a model's bytes from its parameter count alone (weights, and when
// `training` also gradients and AdamW's two moments, over `model_shards` ranks, the moments
// over `optimizer_shards` more with ZeRO-1 and the gradients over `gradient_shards` more with
// ZeRO-2), refused before the exact plan lays out a model far too large to plan quickly.
void check_parameter_memory(const ModelConfig& model, bool training, int64_t model_shards,
                            int64_t optimizer_shards, int64_t gradient_shards, Communicator& world,
                            const std::string& what, const std::string& advice);

// The same, before a plan of many layers: a plan holds bookkeeping for every layer, so a
// config.json claiming 250,000 layers took a minute and 7 GiB to plan before it was refused.
// Every block but the first plans alike (LaX's block 0 has no G), so the plans of 2 and 3
// layers give each further layer's bytes; a model whose estimate exceeds the memory available
// is refused with check_available_memory's message. One stage (no pipeline) only; a model of
// few layers is left to the whole plan.
void check_layers_memory(const ModelConfig& model, const TensorParallel& tp, int64_t batch,
                         int64_t seq, Communicator& world, const std::string& what,
                         const std::string& advice);

// What a backend's kernels keep beside the tensors while a rank trains (plan_kernel_scratch).
struct KernelScratch {
  int64_t attention = 0;  // Backend::attention_workspace_bytes
  int64_t other = 0;      // Backend::kernel_scratch_bytes and the largest GEMM's scratch
};

// The scratch `be` keeps while TP rank `tp_rank` of `stage` trains `config`: its attention's
// workspace, its other kernels' at the step's widest rows (Backend::kernel_scratch_bytes), and
// the largest Backend::gemm_scratch_bytes of the step's GEMMs. Those are the model's products
// as it issues them (which members of a projection group run as one batched product depends
// on where their buffers lie), so one micro-batch of the step runs on the counting backend,
// which asks `be` for each GEMM's scratch; nothing is computed or allocated. In fp32 no GEMM
// takes any, and that run is skipped.
KernelScratch plan_kernel_scratch(const TrainConfig& config, int tp_rank,
                                  const PipelineStage& stage, Backend& be);

// This rank's footprint when training `config` as `stage` of the pipeline with `tp`,
// `slots` micro-batches in flight; `attention_workspace` is what the backend's attention takes
// beyond the activations (Backend::attention_workspace_bytes: cuDNN's backward on a GPU, the
// cpu backend's per-thread scores), `kernel_scratch` what its other kernels keep
// (plan_kernel_scratch: the cpu backend's bf16 slabs, norm partials and widened GEMM operands).
MemoryBreakdown plan_rank_memory(const TrainConfig& config, const TensorParallel& tp,
                                 const PipelineStage& stage, int slots,
                                 int64_t attention_workspace = 0, int64_t kernel_scratch = 0);

// One process's footprint running `model` (its `stage` of a pipeline) on `batch` rows of `seq`
// tokens (eval, sample, bench step): weights, gradients, activations, the token batches and, when
// `training`, AdamW's moments. Planned in reserve only, no memory used.
MemoryBreakdown plan_model_memory(const ModelConfig& model, const TensorParallel& tp, int64_t batch,
                                  int64_t seq, bool training, PipelineStage stage = {});

// "weights 1.25 GiB, gradients …, optimizer …, activations …, comm …, workspace …", the
// workspace followed by its attention part when there is one ("workspace 530 MiB (attention
// 512 MiB)").
std::string describe_memory(const MemoryBreakdown& m);

// Every rank's `sizes` (the same count on each), exactly, in world rank order.
std::vector<std::vector<size_t>> gather_sizes(Communicator& world, std::span<const size_t> sizes);

// Fails on every rank of `world` when some rank's plan exceeds training.memory_limit (0: no
// limit), naming the key, the limit and the largest rank's plan.
void check_memory_limit(const TrainConfig& config, const MemoryBreakdown& plan, Communicator& world,
                        const std::string& config_path);

}  // namespace bottle
