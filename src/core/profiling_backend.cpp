#include "core/profiling_backend.h"

#include <fmt/format.h>

namespace bottle {

void ProfilingBackend::timed(const std::string& kernel, const std::function<void()>& run,
                             double flops) {
  // The marks bracket the kernel in the inner backend's stream; the kernel may return before
  // it has run, and times() reads them later. A kernel that throws is not timed (its error
  // is what the run reports).
  KernelTime& time = times_[kernel];
  const int64_t from = inner().timing_mark();
  run();
  pending_.push_back({&time, from, inner().timing_mark(), flops});
}

void ProfilingBackend::around(const char* op, std::span<const Tensor>, double,
                              const std::function<void()>& run) {
  // Only GEMMs count FLOPs in a profile (the GFLOP/s column).
  timed(op, run, 0.0);
}

void ProfilingBackend::do_gemm(const GemmArgs& a) {
  const std::string key = fmt::format(
      "gemm {}x{}x{} {}{}{}{}", a.m, a.n, a.k, a.trans_a ? 'T' : 'N', a.trans_b ? 'T' : 'N',
      a.batch > 1 ? fmt::format(" x{}", a.batch) : "", a.any_bf16() ? " bf16" : "");
  timed(
      key, [&] { inner().gemm(a); },
      2.0 * double(a.m) * double(a.n) * double(a.k) * double(a.batch));
}

const std::map<std::string, KernelTime>& ProfilingBackend::times() {
  for (const Pending& p : pending_) {
    p.time->ms += inner().marks_elapsed_ms(p.from, p.to);
    p.time->flops += p.flops;
    ++p.time->calls;
  }
  pending_.clear();
  inner().reset_marks();
  return times_;
}

void ProfilingBackend::reset() {
  pending_.clear();
  inner().reset_marks();
  times_.clear();
}

}  // namespace bottle
