#pragma once
// The PyTorch peer: tools/torch_reference.py, the same model from the same checkpoint, for
// benches that compare side by side. On the CPU it runs under /usr/bin/python3 (Debian
// python3-torch); on a GPU under the first python3 on PATH (the one a GPU image holds its
// CUDA PyTorch in); $BOTTLE_TORCH_PYTHON overrides either.
#include <string>

namespace bottle {

// How the peer runs its steps (tools/torch_reference.py --bench's --device, --dtype and
// --compile).
struct TorchBenchMode {
  std::string device = "cpu";  // "cpu" or "cuda"
  std::string dtype = "f32";   // "f32", or "autocast-bf16": fp32 weights, bf16 autocast forward
  bool compile = false;        // torch.compile the forward and loss
  // Benches only (never tests or CI): run OpenBLAS's best core for this CPU's flags when the
  // environment pins OPENBLAS_CORETYPE to a weaker one (tools/openblas_core.py).
  bool best_blas = false;
};

struct TorchStep {
  double ms_median = 0, ms_min = 0, ms_max = 0;
  std::string version;
  std::string blas_core;         // the OpenBLAS kernels it ran, e.g. "Zen" or "SkylakeX"
  std::string blas_core_source;  // detected by OpenBLAS, or chosen from the CPU's flags
  std::string blas_core_pinned;  // OPENBLAS_CORETYPE as the environment pinned it ("" if not)
  // The first step's loss and global gradient norm (before clipping), NaN if not reported.
  double first_loss = 0, first_grad_norm = 0;
  std::string device, dtype;     // as it ran
  std::string attention;         // "sdpa" (GPU) or "baddbmm+softmax+bmm"
  std::string gpu;               // the GPU's name, on cuda
  // --compile: compiling failed and these times are eager ones; compile_error is the
  // exception's first line.
  bool compile_failed = false;
  std::string compile_error;
};

// Path of tools/torch_reference.py: $BOTTLE_TORCH_SCRIPT, else the source tree's copy.
std::string torch_script_path();
// The interpreter that runs it for `device`: $BOTTLE_TORCH_PYTHON, else /usr/bin/python3 on
// the CPU and python3 (PATH) on cuda.
std::string torch_python(const std::string& device);
// The peer leaves OpenBLAS's CPU detection alone unless OpenBLAS falls back to its SSE
// kernels on a CPU it does not recognise, or (mode.best_blas) the environment pins a weaker
// core than the CPU supports (tools/torch_reference.py, openblas_core). Fails
// with the peer's last line first (e.g. "torch_reference: --device cuda: CUDA is not
// available ...") and its output's tail.
TorchStep run_torch_bench(const std::string& checkpoint, const std::string& shard, int64_t batch,
                          int64_t seq, int64_t steps, int64_t warmup, int threads,
                          const TorchBenchMode& mode = {});

}  // namespace bottle
