#pragma once
#include <optional>

#include "core/backend.h"

namespace bottle {

// The best fp32 GEMM rate (GFLOP/s) this backend gives on this machine now, in the calling
// thread's OpenMP setting: the best of repeated runs of large square products (each shape
// repeated for about a quarter of a second; the larger one only where it takes well under
// that), the denominator of MFU.
double measure_gemm_peak_gflops(Backend& be);

// MFU's denominator, kept honest. A busy machine during the measurement gives a low peak and
// so an efficiency above 100 %, which is a wrong figure: then the peak is measured again
// (keeping the best), and a ratio that still exceeds 1 is given as no figure at all.
class GemmPeak {
 public:
  explicit GemmPeak(Backend& be) : be_(be), gflops_(measure_gemm_peak_gflops(be)) {}
  double gflops() const { return gflops_; }
  // achieved / peak, both per rank; nullopt when even a re-measured peak is below achieved.
  std::optional<double> utilization(double achieved_gflops);

 private:
  Backend& be_;
  double gflops_;
  int remeasured_ = 0;
};

}  // namespace bottle
