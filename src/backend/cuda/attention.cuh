#pragma once
// What the three files of the CUDA attention share, and the launchers each path offers the
// dispatch: attention.cu chooses a path per call; attention_simt.cu runs it with plain fp32
// kernels for any dtype and head dims up to 256; attention_mma.cu with bf16 tensor-core
// (WMMA) kernels for head dims 64 and 128 on sm_80+. Both paths share pass 1 of the backward
// (D, attention_row_terms) and the layout of the scratch. Included by those three files only.
#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/common.cuh"
#include "backend/cuda/kernels.h"

namespace bottle::cuda {

constexpr int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Shared memory above 48 KB must be opted into per kernel; setting it every launch costs no
// synchronisation and keeps the launchers free of static state.
template <class Kernel>
void allow_shared(Kernel kernel, size_t bytes) {
  (void)cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes));
}

// --- attention_simt.cu. q, out [B, S, H, hd]; k, v [B, S, Hkv, hd]; lse, D [B, H, S].
// Forward and backward passes 2 and 3 on fp32 tiles, for any dtype and hd <= 256.
void simt_attention_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k,
                            ConstArray v, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int hd, float scale);
void simt_attention_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout,
                             ConstArray lse, ConstArray q, ConstArray k, ConstArray v,
                             const float* D, int64_t batch, int64_t seq, int64_t heads,
                             int64_t kv_heads, int hd, float scale);
// Backward pass 1, for both paths: D[(b H + h) S + i] = dout_i · out_i over the rows of
// every head.
void attention_row_terms(cudaStream_t stream, float* D, ConstArray dout, ConstArray out,
                         int64_t rows, int64_t seq, int64_t heads, int hd);

// --- attention_mma.cu. Whether the tensor-core kernels take a call (bf16 operands, 16-byte
// aligned, hd 64 or 128, an sm_80+ device), and its forward and backward passes 2 and 3.
bool mma_attention_eligible(int64_t hd, std::initializer_list<ConstArray> operands);
void mma_attention_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k,
                           ConstArray v, int64_t batch, int64_t seq, int64_t heads,
                           int64_t kv_heads, int64_t hd, float scale);
void mma_attention_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout,
                            ConstArray lse, ConstArray q, ConstArray k, ConstArray v,
                            const float* D, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int64_t hd, float scale);

}  // namespace bottle::cuda
