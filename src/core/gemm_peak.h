#pragma once
#include "core/backend.h"

namespace bottle {
// The best fp32 GEMM rate (GFLOP/s) this backend gives on this machine now, over two large
// square products: the denominator of MFU.
double measure_gemm_peak_gflops(Backend& be);
}  // namespace bottle
