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

#include "core/backend.h"

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

class CountingBackend final : public Backend {
 public:
  CountingBackend() = default;
  CountingBackend(const CountingBackend&) = delete;
  CountingBackend& operator=(const CountingBackend&) = delete;
  ~CountingBackend() override;
  // Kernels count under the string `*phase` points to while it is set (the TP communicator's
  // phase, "recompute." while a block is recomputed), else under "".
  void set_phase_source(const std::string* phase) { phase_ = phase; }
  const std::map<std::string, OpCounts>& counts() const { return counts_; }
  void reset() { counts_.clear(); }
  // Bytes reserved now and at most, over every allocation this backend made.
  size_t reserved_bytes() const { return reserved_; }
  size_t peak_reserved_bytes() const { return peak_reserved_; }

  std::string_view name() const override { return "counting"; }
  std::string bf16_unsupported() const override { return ""; }
  std::string bf16_gemm_path() const override { return "counted, not run"; }
  Device device() const override { return Device::cpu; }
  // What a device backend would wait for: every synchronize and every op that returns device
  // data to the host (to_host, first_outside, sum, sum_squares).
  void synchronize() override { ++host_waits_; }
  int64_t host_waits() const override { return host_waits_; }
  void* allocate(size_t bytes, const char* what) override;
  void deallocate(void* p, size_t bytes) override;
  void to_host(void* dst, Tensor src) override;
  void from_host(Tensor dst, const void* src) override;
  void copy(Tensor dst, Tensor src) override;
  void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                    int64_t cols) override;
  int64_t first_outside(Tensor ids, int64_t lo, int64_t hi) override;

  void gemm(const GemmArgs& args) override;
  void embedding_forward(Tensor out, Tensor tokens, Tensor table) override;
  void embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override;
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override;
  void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                        Tensor rstd) override;
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias,
                         float eps) override;
  void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                          Tensor weight, Tensor mean, Tensor rstd) override;
  void rope_forward(Tensor x, float theta) override;
  void rope_backward(Tensor dx, float theta) override;
  void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override;
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                          Tensor q, Tensor k, Tensor v) override;
  void silu_forward(Tensor out, Tensor x) override;
  void silu_backward(Tensor dx, Tensor dout, Tensor x) override;
  void swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override;
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                       bool gate_act) override;
  void add(Tensor out, Tensor a, Tensor b) override;
  void accumulate(Tensor dst, Tensor src) override;
  void fill_zero(Tensor x) override;
  void scale(Tensor x, float factor) override;
  double sum_squares(Tensor x) override;
  double sum(Tensor x) override;
  void multiply(Tensor out, Tensor a, Tensor b) override;
  void divide(Tensor out, Tensor a, Tensor b) override;
  void rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                            bool reciprocal) override;
  void cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits, Tensor targets) override;
  void cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets, float scale) override;
  void embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override;
  void embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout, int64_t first) override;
  void logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override;
  void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                    Tensor targets, int64_t first, float scale) override;
  void rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight, float eps) override;
  void rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                              Tensor rstd, Tensor dot, int64_t d) override;
  void cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                    Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                    int64_t first) override;
  void cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                  Tensor max) override;
  void scale_rows(Tensor out, Tensor x, Tensor factor) override;
  void row_dot(Tensor out, Tensor a, Tensor b) override;
  void sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) override;
  void accumulate_mean(Tensor acc, Tensor x) override;
  void scalar_add(Tensor out, Tensor a, Tensor b) override;
  void scalar_divide(Tensor out, Tensor a, double divisor) override;
  void scalar_sqrt(Tensor out, Tensor a) override;
  void clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) override;
  void adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v, Tensor control,
                    const AdamWArgs& args) override;

 private:
  OpCounts& here() { return counts_[phase_ ? *phase_ : std::string()]; }
  int64_t host_waits_ = 0;
  void count(const char* kernel, std::initializer_list<Tensor> operands, double flops = 0.0);

  struct Reservation {
    char* base;
    size_t bytes, used;
  };
  std::vector<Reservation> reservations_;
  const std::string* phase_ = nullptr;
  std::map<std::string, OpCounts> counts_;
  size_t reserved_ = 0, peak_reserved_ = 0;
};

}  // namespace bottle
