// Causal attention with GQA (kernels.h): the choice of kernels for each call. bf16 operands,
// 16-byte aligned, with head dim 64 or 128 on an sm_80+ GPU run on tensor cores
// (attention_mma.cu); every other call (fp32, other head dims up to 256) on the fp32 tiles of
// attention_simt.cu, whose header comment describes the algorithm both follow. The backward's
// first pass (D = dout · out per row) is the same kernel on either path.
#include <cmath>
#include <cstddef>
#include <cstdint>

#include "backend/cuda/attention.cuh"
#include "backend/cuda/kernels.h"

namespace bottle::cuda {

void attention_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k,
                       ConstArray v, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                       int64_t hd) {
  if (batch * seq * heads == 0) return;  // nothing to compute, and a launch needs a block
  const float scale = 1.0f / std::sqrt(float(hd));
  if (mma_attention_eligible(hd, {q, k, v}))
    mma_attention_forward(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, hd, scale);
  else
    simt_attention_forward(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, int(hd), scale);
}

size_t attention_backward_scratch_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                        int64_t hd) {
  return size_t(batch * heads * seq) * sizeof(float);  // D
}

void attention_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout,
                        ConstArray out, ConstArray lse, ConstArray q, ConstArray k, ConstArray v,
                        int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd,
                        void* scratch) {
  if (batch * seq * heads == 0) return;  // nothing to compute, and a launch needs a block
  const float scale = 1.0f / std::sqrt(float(hd));
  float* const D = static_cast<float*>(scratch);  // [B, H, S]
  attention_row_terms(stream, D, dout, out, batch * seq * heads, seq, heads, int(hd));
  if (mma_attention_eligible(hd, {q, k, v, dout}))
    mma_attention_backward(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads,
                           hd, scale);
  else
    simt_attention_backward(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads,
                            int(hd), scale);
}

}  // namespace bottle::cuda
