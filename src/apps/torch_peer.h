#pragma once
// The PyTorch peer: tools/torch_reference.py run by /usr/bin/python3 (Debian python3-torch),
// the same model from the same checkpoint, for benches that compare side by side.
#include <string>

namespace bottle {

struct TorchStep {
  double ms_median = 0, ms_min = 0, ms_max = 0;
  std::string version;
  std::string blas_core;         // the OpenBLAS kernels it ran, e.g. "Zen" or "SkylakeX"
  std::string blas_core_source;  // detected by OpenBLAS, or chosen from the CPU's flags
};

// Path of tools/torch_reference.py: $BOTTLE_TORCH_SCRIPT, else the source tree's copy.
std::string torch_script_path();
// The peer leaves OpenBLAS's CPU detection alone unless OpenBLAS falls back to its SSE
// kernels on a CPU it does not recognise (tools/torch_reference.py, openblas_core).
TorchStep run_torch_bench(const std::string& checkpoint, const std::string& shard, int64_t batch,
                          int64_t seq, int64_t steps, int64_t warmup, int threads);

}  // namespace bottle
