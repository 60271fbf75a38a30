// Rotary embedding (HF rotate-half), in place on q [B, S, H, hd] and k [B, S, Hkv, hd] in one
// launch: pair i of every head vector, (x[i], x[i + hd/2]) for i < hd/2, turns by the angle
// pos · inv_freq(i), pos = s. The cos and sin come from a table the backend computes on the
// host once per (sequence length, head size, theta), as the cpu backend computes its own, so
// the GPU's rotations match the CPU's bit for bit and no thread spends time on sinf / cosf.
#include "core/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per pair: pairs [0, q_pairs) of q, then those of k. Within a head vector the
// threads of pairs i read x[i] and x[i + hd/2], two coalesced runs, and the table's row of
// position s, one more.
__global__ void rope_kernel(Array q, Array k,    // [batch, seq, q_heads | k_heads, hd]
                            const float* table,  // [2, seq, hd / 2]: cos, then sin
                            int64_t q_pairs, int64_t pairs, int64_t seq, int64_t q_heads,
                            int64_t k_heads, int64_t hd, float direction) {
  const int64_t half = hd / 2;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const bool in_q = p < q_pairs;
    const Array x = in_q ? q : k;
    const int64_t heads = in_q ? q_heads : k_heads, local = in_q ? p : p - q_pairs;
    const int64_t vec = local / half, i = local - vec * half;  // vec = (b · seq + s) · heads + h
    const int64_t s = (vec / heads) % seq;
    const float cos_a = table[s * half + i], sin_a = direction * table[(seq + s) * half + i];
    const int64_t at = vec * hd + i;
    float x1 = load(ConstArray(x), at), x2 = load(ConstArray(x), at + half);
    kmath::rope_rotate(x1, x2, cos_a, sin_a);
    store(x, at, x1);
    store(x, at + half, x2);
  }
}

}  // namespace

void rope(cudaStream_t stream, Array q, Array k, const float* table, int64_t batch, int64_t seq,
          int64_t q_heads, int64_t k_heads, int64_t hd, float direction) {
  const int64_t q_pairs = batch * seq * q_heads * (hd / 2);
  const int64_t pairs = q_pairs + batch * seq * k_heads * (hd / 2);
  if (pairs <= 0) return;
  rope_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(q, k, table, q_pairs, pairs, seq,
                                                                  q_heads, k_heads, hd, direction);
}

}  // namespace bottle::cuda
