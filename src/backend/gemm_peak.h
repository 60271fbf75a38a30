#pragma once
#include <optional>

#include "backend/backend.h"

namespace bottle {

// The best GEMM rate (GFLOP/s) this backend gives on this machine now, in the calling
// thread's OpenMP setting, with operands of `dtype` (f32, or bf16 the way a bf16 run's GEMMs
// go: on bf16 instructions, or widened): the best of repeated runs of large square products
// (each shape repeated for about a quarter of a second; the larger one only where it takes
// well under that), the denominator of MFU.
double measure_gemm_peak_gflops(Backend& be, DType dtype = DType::f32);

// MFU's denominator, kept honest. A busy machine during the measurement gives a low peak and
// so an efficiency above 100 %, which is a wrong figure: then the peak is measured again
// (keeping the best), and a ratio that still exceeds 1 is given as no figure at all.
class GemmPeak {
 public:
  explicit GemmPeak(Backend& be, DType dtype = DType::f32)
      : be_(be), dtype_(dtype), gflops_(measure_gemm_peak_gflops(be, dtype)) {}
  double gflops() const { return gflops_; }
  // achieved / peak, both per rank; nullopt when even a re-measured peak is below achieved.
  std::optional<double> utilization(double achieved_gflops);

 private:
  Backend& be_;
  DType dtype_;
  double gflops_;
  int remeasured_ = 0;
};

}  // namespace bottle
