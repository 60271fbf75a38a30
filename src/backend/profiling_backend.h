#pragma once
// A backend that times every kernel of the backend it wraps, so that a bench can say where a
// step's time goes. Each kernel is bracketed by two of the inner backend's timing marks (CUDA
// events on a device, wall-clock instants on the host) and nothing waits between kernels: the
// marks are read when times() is, so a device step runs as fast as it does unprofiled.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace bottle {

struct KernelTime {
  int64_t calls = 0;
  double ms = 0.0;
  double flops = 0.0;  // GEMMs only
};

class ProfilingBackend final : public ForwardingBackend {
 public:
  explicit ProfilingBackend(std::unique_ptr<Backend> inner) : ForwardingBackend(std::move(inner)) {}
  // Per kernel; GEMMs per shape, as "gemm m x n x k [NT]". Reads the marks recorded since the
  // last call (waiting for the last of them).
  const std::map<std::string, KernelTime>& times();
  // Per range (Backend::push_range; nested names joined by '.', "recompute.qkv"): the kernels
  // run inside it, each counted under its innermost range's path alone. Read as times() is.
  const std::map<std::string, KernelTime>& range_times();
  void reset();

  void push_range(const char* name) override;
  void pop_range() override;

  // GEMMs are timed per shape.
  void do_gemm(const GemmArgs& args) override;

 protected:
  void around(const char* op, std::span<const Tensor> traffic, double flops,
              const std::function<void()>& run) override;

 private:
  // A kernel between two marks, not yet read.
  struct Pending {
    KernelTime* time;
    KernelTime* range;  // null outside every range
    int64_t from, to;
    double flops;
  };
  void timed(const std::string& kernel, const std::function<void()>& run, double flops);
  void read_marks();

  std::map<std::string, KernelTime> times_, range_times_;
  std::vector<Pending> pending_;
  std::vector<size_t> range_ends_;  // where each open range's name ends in range_path_
  std::string range_path_;          // the open ranges' names joined by '.'; "" outside them
};

}  // namespace bottle
