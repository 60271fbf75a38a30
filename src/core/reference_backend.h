#pragma once
// The reference backend: every kernel as the plainest naive loop, accumulating in double.
// Slow on purpose; tests use it as the oracle the fast backends are compared against.
//
// The class is declared here and defined one op family to a file in src/core/reference/,
// the families of src/core/cuda/ (plus gemm.cpp, which the CUDA backend leaves to
// cuBLASLt); the checks the families share are in src/core/reference/common.h. Only f32
// float tensors and i32 token/target tensors are supported (WideningBackend feeds bf16).
#include <memory>
#include <string_view>

#include "core/host_backend.h"

namespace bottle {

class ReferenceBackend final : public HostBackend {
 public:
  std::string_view name() const override { return "reference"; }

 protected:
  // Matrix products (gemm.cpp).
  void do_gemm(const GemmArgs& g) override;

  // Copies, indices and elementwise kernels (elementwise.cpp).
  void do_copy(Tensor dst, Tensor src) override;
  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override;
  int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) override;
  void do_fill_zero(Tensor x) override;
  void do_add(Tensor out, Tensor a, Tensor b) override;
  void do_accumulate(Tensor dst, Tensor src) override;
  void do_scale(Tensor x, float factor) override;
  void do_multiply(Tensor out, Tensor a, Tensor b) override;
  void do_divide(Tensor out, Tensor a, Tensor b) override;
  void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                               bool reciprocal) override;
  void do_scale_rows(Tensor out, Tensor x, Tensor factor) override;
  void do_row_dot(Tensor out, Tensor a, Tensor b) override;
  void do_silu_forward(Tensor out, Tensor x) override;
  void do_silu_backward(Tensor dx, Tensor dout, Tensor x) override;
  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override;
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                          bool gate_act) override;

  // Reductions to one scalar (reduce.cpp).
  double do_sum(Tensor x) override;
  double do_sum_squares(Tensor x) override;

  // Embedding lookups, whole and vocabulary-sharded (embedding.cpp).
  void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) override;
  void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override;
  void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override;
  void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                   int64_t first) override;

  // RMSNorm, its sharded and fused variants, and LayerNorm (norm.cpp).
  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override;
  void do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x, Tensor residual,
                                   Tensor weight, float eps) override;
  void do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                float eps) override;
  void do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                           Tensor rstd) override;
  void do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                                 Tensor rstd, Tensor dot, int64_t d) override;
  void do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                            Tensor bias, float eps) override;
  void do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                             Tensor weight, Tensor mean, Tensor rstd) override;

  // Rotary embedding (rope.cpp).
  void do_rope_forward(Tensor q, Tensor k, float theta) override;
  void do_rope_backward(Tensor dq, Tensor dk, float theta) override;

  // Causal GQA attention (attention.cpp).
  void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override;
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                             Tensor q, Tensor k, Tensor v) override;

  // Cross-entropy, whole and vocabulary-sharded (cross_entropy.cpp).
  void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                Tensor targets) override;
  void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                 float scale) override;
  void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override;
  void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                       Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                       int64_t first) override;
  void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                     Tensor max) override;
  void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                       Tensor targets, int64_t first, float scale) override;

  // AdamW (adamw.cpp).
  void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                       Tensor control, const AdamWArgs& a) override;
};

std::unique_ptr<Backend> make_reference_backend();

}  // namespace bottle
