// Rotary embedding (HF rotate-half), in place on q [B, S, H, hd] and k [B, S, Hkv, hd] in one
// launch: pair i of every head vector, (x[i], x[i + hd/2]) for i < hd/2, turns by the angle
// pos · inv_freq(i), pos = s. The cos and sin come from a table the backend computes on the
// host once per (sequence length, head size, theta), as the cpu backend computes its own, so
// the GPU's rotations match the CPU's bit for bit and no thread spends time on sinf / cosf.
#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per kW adjacent pairs (kPack with 128-bit accesses when half a head vector is
// whole packs of aligned arrays, else 1): pair groups [0, q_groups) of q, then those of k.
// Within a head vector the threads of pairs i read x[i] and x[i + hd/2], two coalesced runs,
// and the table's row of position s, one more.
template <int kW>
__global__ void rope_kernel(Array q, Array k,    // [batch, seq, q_heads | k_heads, hd]
                            const float* table,  // [2, seq, hd / 2]: cos, then sin
                            int64_t q_groups, int64_t groups, int64_t seq, int64_t q_heads,
                            int64_t k_heads, int64_t hd, float direction) {
  const int64_t half = hd / 2, per_vec = half / kW;
  const ConstArray cos_table{table, DType::f32}, sin_table{table + seq * half, DType::f32};
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < groups; p += stride) {
    const bool in_q = p < q_groups;
    const Array x = in_q ? q : k;
    const int64_t heads = in_q ? q_heads : k_heads, local = in_q ? p : p - q_groups;
    const int64_t vec = local / per_vec;  // vec = (b · seq + s) · heads + h
    const int64_t i = (local - vec * per_vec) * kW;
    const int64_t s = (vec / heads) % seq;
    const int64_t at = vec * hd + i;
    float x1[kW], x2[kW], c[kW], sn[kW];
    load_lanes<kW>(x, at, x1);
    load_lanes<kW>(x, at + half, x2);
    load_lanes<kW>(cos_table, s * half + i, c);
    load_lanes<kW>(sin_table, s * half + i, sn);
#pragma unroll
    for (int e = 0; e < kW; ++e) kmath::rope_rotate(x1[e], x2[e], c[e], direction * sn[e]);
    store_lanes<kW>(x, at, x1);
    store_lanes<kW>(x, at + half, x2);
  }
}

}  // namespace

void rope(cudaStream_t stream, Array q, Array k, const float* table, int64_t batch, int64_t seq,
          int64_t q_heads, int64_t k_heads, int64_t hd, float direction) {
  const int64_t half = hd / 2;
  const int64_t q_pairs = batch * seq * q_heads * half;
  const int64_t pairs = q_pairs + batch * seq * k_heads * half;
  if (pairs <= 0) return;
  if (half % kPack == 0 && packable({q.data, k.data, table})) {
    const int64_t groups = pairs / kPack;
    rope_kernel<kPack><<<device_grid_for(groups, kThreads), kThreads, 0, stream>>>(
        q, k, table, q_pairs / kPack, groups, seq, q_heads, k_heads, hd, direction);
    return;
  }
  rope_kernel<1><<<device_grid_for(pairs, kThreads), kThreads, 0, stream>>>(
      q, k, table, q_pairs, pairs, seq, q_heads, k_heads, hd, direction);
}

}  // namespace bottle::cuda
