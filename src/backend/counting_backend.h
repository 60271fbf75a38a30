#pragma once
// A backend that does no arithmetic and holds no memory: `bottle plan`'s dry run. The real
// training step runs on it unchanged; every kernel is counted (calls, FLOPs, bytes its operands
// occupy) and every GEMM by shape, while allocations reserve address space that is never
// touched (as a reserve-only Arena does), so a 40B model's stage plans in milliseconds. A
// stray host access to a tensor faults at once instead of reading garbage.
//
// Allocations are laid out one after another in large reservations (64 GiB of address space
// each), as a heap lays out a run's buffers, so that code that batches operands found evenly
// spaced in memory (gemm_grouped) finds them much as it does on the host backend; whether it
// does depends on the allocator, there as here, and changes how many GEMMs run, never the
// products or their FLOPs.
//
// Counting rules (docs/design.md §22): a GEMM is 2·m·n·k·batch FLOPs and reads A and B and
// writes C (C read too when beta ≠ 0); causal attention forward is 4·B·H·hd·S(S+1)/2 FLOPs
// (QKᵀ and PV over the lower triangle), its backward 2.5 times that (QKᵀ again, dP, dV, dQ,
// dK); every other kernel is memory-bound: its bytes are each tensor operand once, and its
// FLOPs are not counted.
#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace bottle {

struct GemmShape {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  int a_size = 4, b_size = 4, c_size = 4;  // bytes per element of each operand
  bool accumulate = false;                 // beta ≠ 0: C is read as well as written
  auto operator<=>(const GemmShape&) const = default;
  // Any operand in bf16: the GEMM runs at the bf16 (tensor-core) rate.
  bool any_bf16() const { return a_size == 2 || b_size == 2 || c_size == 2; }
  double flops() const { return 2.0 * double(m) * double(n) * double(k) * double(batch); }
  // A and B read, C written (and read when accumulating).
  double bytes() const;
};

struct KernelCount {
  int64_t calls = 0;
  double flops = 0.0;
  double bytes = 0.0;
};

// What one phase of a dry run issued.
struct OpCounts {
  std::map<GemmShape, int64_t> gemms;          // calls per shape
  std::map<std::string, KernelCount> kernels;  // every other kernel, by name
  double gemm_flops() const;
  double flops() const;  // GEMMs and attention
  void add(const OpCounts& other);
};

class CountingBackend final : public ForwardingBackend {
 public:
  CountingBackend() : ForwardingBackend(nullptr) {}
  CountingBackend(const CountingBackend&) = delete;
  CountingBackend& operator=(const CountingBackend&) = delete;
  ~CountingBackend() override;
  // Kernels count under the string `*phase` points to while it is set (the TP communicator's
  // phase, "recompute." while a block is recomputed), else under "".
  void set_phase_source(const std::string* phase) { phase_ = phase; }
  // While set, every kernel also counts into *segment (the caller swaps it between the
  // TP group's calls, so that a dry run's timeline knows the work between two calls).
  void set_segment(OpCounts* segment) { segment_ = segment; }
  const std::map<std::string, OpCounts>& counts() const { return counts_; }
  void reset() { counts_.clear(); }
  // Bytes reserved now and at most, over every allocation this backend made.
  size_t reserved_bytes() const { return reserved_; }
  size_t peak_reserved_bytes() const { return peak_reserved_; }

  // Nothing runs, so nothing is forwarded: these are a host backend's.
  std::string_view name() const override { return "counting"; }
  std::string bf16_unsupported() const override { return ""; }
  std::string bf16_gemm_path() const override { return "counted, not run"; }
  Device device() const override { return Device::cpu; }
  void* native_stream() const override { return nullptr; }
  size_t device_memory_free() override { return 0; }
  int64_t timing_mark() override { return Backend::timing_mark(); }
  double marks_elapsed_ms(int64_t from, int64_t to) override {
    return Backend::marks_elapsed_ms(from, to);
  }
  void reset_marks() override { Backend::reset_marks(); }
  std::string attention_path(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, DType dtype) override {
    return Backend::attention_path(batch, seq, heads, kv_heads, head_dim, dtype);
  }
  int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, DType dtype) override {
    return Backend::attention_workspace_bytes(batch, seq, heads, kv_heads, head_dim, dtype);
  }
  int64_t kernel_scratch_bytes(const KernelShapes& shapes) override {
    return Backend::kernel_scratch_bytes(shapes);
  }
  int64_t gemm_scratch_bytes(const GemmArgs& args) override {
    return Backend::gemm_scratch_bytes(args);
  }
  void release_scratch() override {}
  // While set, every GEMM also asks `source` what scratch it would take for it
  // (gemm_scratch_bytes), and largest_gemm_scratch() keeps the most: a dry micro-batch tells the
  // memory plan the GEMM scratch of the step `source` will run (train/memory_plan.h).
  void set_gemm_scratch_source(Backend* source) { gemm_scratch_source_ = source; }
  int64_t largest_gemm_scratch() const { return largest_gemm_scratch_; }
  // What a device backend would wait for: every synchronize and every op that returns device
  // data to the host (to_host, first_outside, sum, sum_squares).
  void synchronize() override { ++host_waits_; }
  int64_t host_waits() const override { return host_waits_; }
  void* allocate(size_t bytes, const char* what) override;
  void deallocate(void* p, size_t bytes) override;
  // GEMMs count by shape.
  void do_gemm(const GemmArgs& args) override;

 protected:
  void around(const char* op, std::span<const Tensor> traffic, double flops,
              const std::function<void()>& run) override;

 private:
  OpCounts& here() { return counts_[phase_ ? *phase_ : std::string()]; }
  // The OpCounts one kernel counts into: its phase's, and the segment's when one is set.
  template <typename Count>
  void count(Count&& add) {
    add(here());
    if (segment_) add(*segment_);
  }
  int64_t host_waits_ = 0;

  struct Reservation {
    char* base;
    size_t bytes, used;
  };
  std::vector<Reservation> reservations_;
  const std::string* phase_ = nullptr;
  OpCounts* segment_ = nullptr;
  Backend* gemm_scratch_source_ = nullptr;
  int64_t largest_gemm_scratch_ = 0;
  std::map<std::string, OpCounts> counts_;
  size_t reserved_ = 0, peak_reserved_ = 0;
};

}  // namespace bottle
