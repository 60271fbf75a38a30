#pragma once
// bf16 storage on a host backend whose kernels compute in fp32: each kernel's bf16 tensors
// are widened into fp32 scratch (exactly: a bf16 value is an fp32 value), the fp32 kernel
// runs, and its bf16 outputs are rounded back to nearest even. So a bf16 run stores what a
// native bf16 kernel that computes in fp32 would store, and on the reference backend this is
// the exact oracle of it. GEMMs go to the wrapped backend as bf16 where it runs them on bf16
// instructions (bf16_gemm_path()), else widened the same way. make_backend wraps the reference
// in it, and the cpu backend as "cpu-widened": the cpu kernels as bf16 ran before they took it
// themselves, kept as a fallback and as the bits tests/core/test_bf16_host_kernels.cpp holds the
// native kernels to.
//
// The scratch lives as long as one kernel call; it grows to the largest call's operands and
// is counted as workspace memory.
#include <memory>
#include <string>
#include <vector>

#include "core/forwarding_backend.h"

namespace bottle {

class WideningBackend final : public ForwardingBackend {
 public:
  explicit WideningBackend(std::unique_ptr<Backend> inner);
  ~WideningBackend() override;
  std::string bf16_unsupported() const override { return {}; }
  std::string bf16_gemm_path() const override;

  // The ops that take bf16 tensors; the rest (staging, ids, the device scalars) are the inner
  // backend's as they are.
  void do_copy(Tensor dst, Tensor src) override;
  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override;

  void do_gemm(const GemmArgs& args) override;
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
  void do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) override;
  void do_accumulate_mean(Tensor acc, Tensor x) override;

 private:
  class Widened;
  std::vector<float>& scratch(size_t index, size_t elements);

  bool native_gemm_ = false;
  // One buffer per tensor widened within a kernel call, reused by the next call.
  std::vector<std::vector<float>> scratch_;
  size_t scratch_in_use_ = 0;
};

}  // namespace bottle
