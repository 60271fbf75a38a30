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
  // attention.cpp: the backward's per-thread scores (the forward's are half) and, in bf16, its
  // eight per-thread slabs.
  int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, DType dtype) override;
  // norm.cpp: a LayerNorm backward's per-thread partials of its weight and bias gradients.
  int64_t norm_scratch_bytes(int64_t width, DType dtype) override;

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
