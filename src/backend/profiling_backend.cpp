#include "backend/profiling_backend.h"

#include <fmt/format.h>

namespace bottle {

void ProfilingBackend::timed(const std::string& kernel, const std::function<void()>& run,
                             double flops) {
  // The marks bracket the kernel in the inner backend's stream; the kernel may return before
  // it has run, and times() reads them later. A kernel that throws is not timed (its error
  // is what the run reports).
  KernelTime& time = times_[kernel];
  KernelTime* range = range_path_.empty() ? nullptr : &range_times_[range_path_];
  const int64_t from = inner().timing_mark();
  run();
  pending_.push_back({&time, range, from, inner().timing_mark(), flops});
}

void ProfilingBackend::push_range(const char* name) {
  range_ends_.push_back(range_path_.size());
  if (!range_path_.empty()) range_path_ += '.';
  range_path_ += name;
  ForwardingBackend::push_range(name);
}

void ProfilingBackend::pop_range() {
  BOTTLE_ASSERT(!range_ends_.empty(), "ProfilingBackend: a range popped that was never pushed");
  range_path_.resize(range_ends_.back());
  range_ends_.pop_back();
  ForwardingBackend::pop_range();
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

void ProfilingBackend::read_marks() {
  for (const Pending& p : pending_) {
    const double ms = inner().marks_elapsed_ms(p.from, p.to);
    for (KernelTime* t : {p.time, p.range}) {
      if (!t) continue;
      t->ms += ms;
      t->flops += p.flops;
      ++t->calls;
    }
  }
  pending_.clear();
  inner().reset_marks();
}

const std::map<std::string, KernelTime>& ProfilingBackend::times() {
  read_marks();
  return times_;
}

const std::map<std::string, KernelTime>& ProfilingBackend::range_times() {
  read_marks();
  return range_times_;
}

void ProfilingBackend::reset() {
  pending_.clear();
  inner().reset_marks();
  times_.clear();
  range_times_.clear();
}

}  // namespace bottle
