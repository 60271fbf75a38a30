#pragma once
// A backend that hands every op to another backend (`inner`) through one hook, around(), so
// that a wrapper overrides the hook and only the ops it changes: the profiler times the hook,
// the counting backend of `bottle plan` counts it and runs nothing, the widening backend
// overrides the ops that take bf16. Adding an op to Backend adds one forwarder here, with the
// tensors it moves (its traffic) and, for attention, its FLOPs, written once for every wrapper.
//
// Traffic: every tensor the op reads, and once more every tensor it also writes after reading
// it (a backward kernel that adds into its gradient). Where an op touches part of a tensor,
// the part: an embedding reads one table row per token (the output's size), a column copy its
// columns, sum_squares_ranges its ranges.
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>

#include "core/backend.h"

namespace bottle {

class ForwardingBackend : public Backend {
 public:
  // inner may be null for a backend that runs nothing (the counting backend), which then
  // overrides the memory operations and never calls run in around().
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  Backend& inner() const {
    BOTTLE_ASSERT(inner_ != nullptr, "{}: no inner backend to run an op on", name());
    return *inner_;
  }

  // What is not an op: the inner backend's.
  std::string_view name() const override { return inner().name(); }
  std::string bf16_unsupported() const override { return inner().bf16_unsupported(); }
  std::string bf16_gemm_path() const override { return inner().bf16_gemm_path(); }
  Device device() const override { return inner().device(); }
  void* native_stream() const override { return inner().native_stream(); }
  void synchronize() override { inner().synchronize(); }
  int64_t host_waits() const override { return inner().host_waits(); }
  int64_t timing_mark() override { return inner().timing_mark(); }
  double marks_elapsed_ms(int64_t from, int64_t to) override {
    return inner().marks_elapsed_ms(from, to);
  }
  void reset_marks() override { inner().reset_marks(); }
  size_t device_memory_free() override { return inner().device_memory_free(); }
  void* allocate(size_t bytes, const char* what) override { return inner().allocate(bytes, what); }
  void deallocate(void* p, size_t bytes) override { inner().deallocate(p, bytes); }
  std::string attention_path(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, DType dtype) override {
    return inner().attention_path(batch, seq, heads, kv_heads, head_dim, dtype);
  }
  int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, DType dtype) override {
    return inner().attention_workspace_bytes(batch, seq, heads, kv_heads, head_dim, dtype);
  }

  // The ops, each through around().
  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override;
  void do_gemm(const GemmArgs& args) override;
  void do_to_host(void* dst, Tensor src) override;
  void do_from_host(Tensor dst, const void* src) override;
  void do_copy(Tensor dst, Tensor src) override;
  int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) override;
  void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) override;
  void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override;
  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override;
  void do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x, Tensor residual,
                                   Tensor weight, float eps) override;
  void do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                           Tensor rstd) override;
  void do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                            Tensor bias, float eps) override;
  void do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                             Tensor weight, Tensor mean, Tensor rstd) override;
  void do_rope_forward(Tensor q, Tensor k, float theta) override;
  void do_rope_backward(Tensor dq, Tensor dk, float theta) override;
  void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override;
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                             Tensor q, Tensor k, Tensor v) override;
  void do_silu_forward(Tensor out, Tensor x) override;
  void do_silu_backward(Tensor dx, Tensor dout, Tensor x) override;
  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override;
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                          bool gate_act) override;
  void do_add(Tensor out, Tensor a, Tensor b) override;
  void do_accumulate(Tensor dst, Tensor src) override;
  void do_fill_zero(Tensor x) override;
  void do_scale(Tensor x, float factor) override;
  double do_sum_squares(Tensor x) override;
  double do_sum(Tensor x) override;
  void do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) override;
  void do_accumulate_mean(Tensor acc, Tensor x) override;
  void do_scalar_add(Tensor out, Tensor a, Tensor b) override;
  void do_scalar_divide(Tensor out, Tensor a, double divisor) override;
  void do_scalar_sqrt(Tensor out, Tensor a) override;
  void do_clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) override;
  void do_multiply(Tensor out, Tensor a, Tensor b) override;
  void do_divide(Tensor out, Tensor a, Tensor b) override;
  void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                               bool reciprocal) override;
  void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                Tensor targets) override;
  void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                 float scale) override;
  void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override;
  void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                   int64_t first) override;
  void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override;
  void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                       Tensor targets, int64_t first, float scale) override;
  void do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                float eps) override;
  void do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                                 Tensor rstd, Tensor dot, int64_t d) override;
  void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                       Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                       int64_t first) override;
  void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                     Tensor max) override;
  void do_scale_rows(Tensor out, Tensor x, Tensor factor) override;
  void do_row_dot(Tensor out, Tensor a, Tensor b) override;
  void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                       Tensor control, const AdamWArgs& args) override;

 protected:
  // Runs one op: `run` calls the inner backend's. `op` names it (GEMMs: "gemm"), `traffic`
  // lists the tensors it moves (above) and `flops` its arithmetic where it is not memory-bound
  // (attention; GEMMs pass 0, their wrappers see GemmArgs).
  virtual void around(const char* op, std::initializer_list<Tensor> traffic, double flops,
                      const std::function<void()>& run) {
    (void)op, (void)traffic, (void)flops;
    run();
  }

 private:
  std::unique_ptr<Backend> inner_;
};

// QKᵀ and PV over the causal triangle of q [B, S, H, hd]: 2 · 2·hd FLOPs per (query head, i,
// j ≤ i), the count `bottle plan` prices and MFU uses.
double causal_attention_flops(const Tensor& q);

}  // namespace bottle
