#pragma once
// The cpu backend's class: GEMMs on oneDNN (dnnl_gemm.cpp), every other kernel an OpenMP
// loop over rows. Its ops are defined by family in src/backend/cpu/ (elementwise, norm, rope,
// attention, cross_entropy, embedding, adamw, reduce, and cpu_backend.cpp for GEMMs and
// copies), mirroring src/backend/cuda/. Every kernel takes f32 and bf16 tensors (kernels.h says
// how bf16 is read and written); make_cpu_backend() (backend/cpu_backend.h) returns it.
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "backend/cpu/kernels.h"
#include "backend/host_backend.h"

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
  // attention.cpp: the backward's per-thread scores (the forward's are half). Its bf16 slabs
  // share slab_ws_ with every other kernel's: kernel_scratch_bytes counts them.
  int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, DType dtype) override;
  // cpu_backend.cpp: slab_ws_ at the largest of the slabs the kernels below take for the
  // step's rows, and dweight_ws_ at the norms' largest per-thread partials.
  int64_t kernel_scratch_bytes(const KernelShapes& shapes) override;
  // cpu_backend.cpp: gemm_ws_ as widened_gemm takes it for `args` (0 where oneDNN runs it).
  int64_t gemm_scratch_bytes(const GemmArgs& args) override;
  void release_scratch() override;

  // The bf16 slabs per thread (Slabs) each kernel widens its rows into, one row each: the
  // kernels take their count from here, and kernel_scratch_bytes sizes slab_ws_ by them.
  static constexpr int kNormSlabs = 2;               // rmsnorm, layernorm forward: x, out
  static constexpr int kResidualNormSlabs = 4;       // x, residual, sum, out
  static constexpr int kNormBackwardSlabs = 3;       // x, dout, dx
  static constexpr int kRowSlabs = 2;                // scale_rows, row_dot: their two rows
  static constexpr int kLogitSlabs = 2;              // cross-entropy: logits or probs, and dlogits
  static constexpr int kTableSlabs = 1;              // embedding: the row copied or added
  static constexpr int kRopeSlabs = 1;               // one position's heads
  static constexpr int kAttentionSlabs = 4;          // K, V; a query block's Q, O
  static constexpr int kAttentionBackwardSlabs = 8;  // K, V, dK, dV; Q, O, dO, dQ
  // Per-thread partials of a norm's parameter gradients, rows of the norm's width each.
  static constexpr int kRmsNormPartials = 1;    // dweight
  static constexpr int kLayerNormPartials = 2;  // dweight, dbias

 protected:
  // Each kernel of backend/backend_ops.def, defined in the file of its family: embedding.cpp,
  // norm.cpp (the norms, rms_from_sum_squares, scale_rows, row_dot), rope.cpp, attention.cpp,
  // elementwise.cpp, reduce.cpp, cross_entropy.cpp, adamw.cpp, and cpu_backend.cpp (GEMMs,
  // copies, first_outside). Staging and the device scalars are HostBackend's.
#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic) ret do_##op params override;
#define BOTTLE_STAGING_OP(...)
#define BOTTLE_SCALAR_OP(...)
#define BOTTLE_INTO_SCALAR_OP(...)
#include "backend/backend_ops.def"

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
