#pragma once
// The PyTorch peer: tools/torch_reference.py run by /usr/bin/python3 (Debian python3-torch),
// the same model from the same checkpoint, for benches that compare side by side.
#include <string>

namespace bottle {

struct TorchStep {
  double ms_median = 0, ms_min = 0, ms_max = 0;
  std::string version;
};

// Path of tools/torch_reference.py: $BOTTLE_TORCH_SCRIPT, else the source tree's copy.
std::string torch_script_path();
// `openblas_coretype`, when not empty, is exported as OPENBLAS_CORETYPE to the peer alone:
// Debian's OpenBLAS 0.3.21 does not recognise these CPUs and would run its SSE3 kernels,
// which is not PyTorch at its best.
TorchStep run_torch_bench(const std::string& checkpoint, const std::string& shard, int64_t batch,
                          int64_t seq, int64_t steps, int64_t warmup, int threads,
                          const std::string& openblas_coretype);

}  // namespace bottle
