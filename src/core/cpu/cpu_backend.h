#pragma once
// The cpu backend's class: GEMMs on oneDNN (dnnl_gemm.cpp), every other kernel an OpenMP
// loop over rows. Its ops are defined by family in src/core/cpu/ (elementwise, norm, rope,
// attention, cross_entropy, embedding, adamw, reduce, and cpu_backend.cpp for GEMMs and
// copies), mirroring src/core/cuda/. Every kernel takes f32 and bf16 tensors (kernels.h says
// how bf16 is read and written); make_cpu_backend() (core/cpu_backend.h) returns it.
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/cpu/kernels.h"
#include "core/host_backend.h"

namespace bottle::cpu {

// cos/sin of every (position, frequency) pair: [S, hd/2] each.
struct RopeTable {
  std::vector<float> cos, sin;
};

class CpuBackend final : public HostBackend {
 public:
  std::string_view name() const override { return "cpu"; }
  std::string bf16_unsupported() const override { return {}; }
  std::string bf16_gemm_path() const override;

 protected:
  void do_copy(Tensor dst, Tensor src) override;
  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override;
  int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) override;
  void do_gemm(const GemmArgs& args) override;

  // embedding.cpp
  void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) override;
  void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override;
  void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override;
  void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                   int64_t first) override;

  // norm.cpp
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
  void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                               bool reciprocal) override;
  void do_scale_rows(Tensor out, Tensor x, Tensor factor) override;
  void do_row_dot(Tensor out, Tensor a, Tensor b) override;

  // rope.cpp
  void do_rope_forward(Tensor q, Tensor k, float theta) override;
  void do_rope_backward(Tensor dq, Tensor dk, float theta) override;

  // attention.cpp
  void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override;
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                             Tensor q, Tensor k, Tensor v) override;

  // elementwise.cpp
  void do_silu_forward(Tensor out, Tensor x) override;
  void do_silu_backward(Tensor dx, Tensor dout, Tensor x) override;
  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override;
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                          bool gate_act) override;
  void do_add(Tensor out, Tensor a, Tensor b) override;
  void do_accumulate(Tensor dst, Tensor src) override;
  void do_fill_zero(Tensor x) override;
  void do_scale(Tensor x, float factor) override;
  void do_multiply(Tensor out, Tensor a, Tensor b) override;
  void do_divide(Tensor out, Tensor a, Tensor b) override;

  // reduce.cpp
  double do_sum_squares(Tensor x) override;
  double do_sum(Tensor x) override;

  // cross_entropy.cpp
  void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                Tensor targets) override;
  void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                 float scale) override;
  void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override;
  void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                       Tensor targets, int64_t first, float scale) override;
  void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                       Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                       int64_t first) override;
  void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                     Tensor max) override;

  // adamw.cpp
  void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                       Tensor control, const AdamWArgs& a) override;

 private:
  // norm.cpp: the rows of RMSNorm forward and backward, shared by the plain and shard ops.
  void rmsnorm_rows(Tensor out, Tensor rstd, Tensor sumsq, Tensor x, Tensor weight, float eps);
  void rmsnorm_backward_rows(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                             Tensor rstd, Tensor dot, int64_t d);
  // dweight[j] += Σ over threads of partial[t·stride + j], j < c, in thread order.
  static void add_partials(Tensor dweight, const float* partial, int threads, int64_t stride,
                           int64_t c);

  // rope.cpp
  const RopeTable& rope_table(int64_t S, int64_t hd, float theta);
  void rope(Tensor x, float theta, float direction);

  // The (B, S, H, Hkv, hd) of an attention call and its softmax scale.
  struct AttentionDims {
    int64_t B, S, H, Hkv, hd, rep;
    float scale;
  };
  static AttentionDims attention_dims(const Tensor& q, const Tensor& k);
  static constexpr int64_t kQueryBlock = 128;

  // bf16 GEMMs where oneDNN has none on this CPU: operands widened as compact matrices.
  void widened_gemm(const GemmArgs& args);
  void gemm_from_other_c(const GemmArgs& args);

  // Scratch: attention's scores, per-thread parameter-gradient partials, the bf16 windows'
  // slabs, widened norm weights and biases, widened GEMM operands.
  Workspace attn_ws_, dweight_ws_, slab_ws_, weight_ws_, bias_ws_, gemm_ws_;
  std::mutex rope_mutex_;
  std::map<std::tuple<int64_t, int64_t, float>, RopeTable> rope_tables_;
};

}  // namespace bottle::cpu
