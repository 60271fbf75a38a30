// Causal attention with GQA on tensor cores: the three passes of attention_simt.cu (its header
// comment describes the algorithm and the ownership of every gradient row), with every
// product on WMMA bf16 fragments.
//
// Tensor-core path. When q, k, v (and dout, for the backward) are bf16, 16-byte aligned, the
// head dim is 64 or 128 and the GPU is sm_80+, the launchers take kernels that run the same
// three passes with every product on WMMA bf16 16 × 16 × 16 fragments accumulating in fp32;
// the kernels above remain for every other case (fp32, other head dims). Tiles are staged in
// shared memory as bf16, rows padded by 16 bytes (bank spread; fragments stay 32-byte
// aligned). Fragments only meet memory through load/store_matrix_sync and are only scaled
// uniformly, since the accumulator's element layout is unspecified: whatever needs a factor
// per row or per element (mask, softmax, P, dS) is stored to shared memory as fp32 and done
// there by plain threads. P and dS are rounded to bf16 for their products, as in
// FlashAttention; row maxima and sums, lse, D and every accumulator stay fp32.
//  - Forward: 4 warps, 64 queries a block (16 per warp), key tiles of 64. A warp keeps its Q
//    rows as A fragments and its 16 × hd output in accumulators for the whole key walk. Per
//    tile it stores S = Q Kᵀ (16 × 64 fp32) to its own scratch, where lanes 2r and 2r + 1 take
//    row r: tile max, then P = exp2(s scale log2e - m) into the warp's bf16 P buffer, then
//    O += P V. The reference max m is lazy (as in FlashAttention-4): it moves only when a
//    tile's max exceeds it by 8 (log2 units), so P stays below 2^8, and only then is O
//    rescaled, through the warp's scratch; most tiles never take O out of registers. Shared
//    memory: K and V, plus S and P per warp: 60 KB at hd 128 (Q is staged over S and P).
//  - dK, dV: 8 warps; a block owns 64 keys and walks query tiles of 32 for each query head
//    of its group. Phase A: each warp computes one 16 × 16 block of Sᵀ = K Qᵀ and
//    dPᵀ = V dOᵀ; phase B: the same warp turns its block into Pᵀ and dSᵀ (bf16) with the
//    tile's lse and D; phase C, after a block barrier: each warp adds Pᵀ dO and dSᵀ Q into its
//    accumulators, 16 keys × hd/2 of dV and of dK. 79 KB at hd 128.
//  - dQ: 8 warps; a block owns 64 queries and walks key tiles of 32. Phases A, B as above
//    give dS (bf16); phase C adds dS K into 16 queries × hd/2 per warp. 75 KB at hd 128.
// Ownership is as above: each gradient element has one owning warp of one block, which adds
// its fp32 total (staged through shared memory for coalesced stores) into dq/dk/dv once, in
// an order fixed by the shape. Still no atomics, so results still repeat bit for bit.
#include <mma.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>

#include "backend/cuda/attention.cuh"

namespace bottle::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major>;
using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major>;
// The transpose of a row-major tile: K and V as B operands of Q Kᵀ and dO Vᵀ.
using FragBt = wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
// The forward keeps a row's softmax reference max until a tile's max exceeds it by this much
// (log2 units): P stays below 2^8, far from overflow, and the accumulator is rescaled (a
// round trip through shared memory) only on the rare tiles that raise the max that far.
constexpr float kRescaleLog2 = 8.0f;
// Row padding of bf16 tiles, in elements: 16 bytes, so that consecutive rows start in
// different banks and every 16-row fragment stays 32-byte aligned.
constexpr int kPadBf16 = 8;
// The same for fp32 tiles (wmma wants ldm a multiple of 4 floats).
constexpr int kPadF32 = 4;

constexpr size_t align128(size_t bytes) { return (bytes + 127) / 128 * 128; }
template <int kRows, int kLd>
constexpr size_t bf16_tile() {
  return align128(size_t(kRows) * kLd * sizeof(bf16));
}
template <int kRows, int kLd>
constexpr size_t f32_tile() {
  return align128(size_t(kRows) * kLd * sizeof(float));
}

// Forward: 4 warps, 16 query rows each; key tiles of 64.
template <int kHd>
struct TcForward {
  static constexpr int kWarps = 4, kThreads = kWarps * kWarp;
  static constexpr int kRows = 16 * kWarps, kKeys = 64;
  static constexpr int kLd = kHd + kPadBf16;    // Q, K, V (bf16)
  static constexpr int kLs = kKeys + kPadF32;   // scores (fp32), 16 rows per warp
  static constexpr int kLp = kKeys + kPadBf16;  // P (bf16), 16 rows per warp
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + bf16_tile<kKeys, kLd>();
  static constexpr size_t kS = kV + bf16_tile<kKeys, kLd>();
  static constexpr size_t kP = kS + f32_tile<16 * kWarps, kLs>();
  static constexpr size_t kBytes = kP + bf16_tile<16 * kWarps, kLp>();
  // Q is staged over the score and P buffers before the first tile.
  static_assert(bf16_tile<kRows, kLd>() <= kBytes - kS);
  // The accumulator leaves (and is rescaled) through a warp's scores, kKeys columns at a time.
  static_assert(kHd % kKeys == 0 && kKeys % 16 == 0);
};

// dK, dV: 8 warps; a block owns 64 keys and walks query tiles of 32.
template <int kHd>
struct TcDkDv {
  static constexpr int kWarps = 8, kThreads = kWarps * kWarp;
  static constexpr int kKeys = 64, kRows = 32;
  static constexpr int kLd = kHd + kPadBf16;     // K, V, Q, dO (bf16)
  static constexpr int kLt = kRows + kPadF32;    // Sᵀ, dPᵀ (fp32), keys × queries
  static constexpr int kLpt = kRows + kPadBf16;  // Pᵀ, dSᵀ (bf16)
  static constexpr int kLo = kHd + kPadF32;      // dK, dV staged for the final store
  static constexpr size_t kK = 0;
  static constexpr size_t kV = kK + bf16_tile<kKeys, kLd>();
  static constexpr size_t kQ = kV + bf16_tile<kKeys, kLd>();
  static constexpr size_t kDo = kQ + bf16_tile<kRows, kLd>();
  static constexpr size_t kSt = kDo + bf16_tile<kRows, kLd>();
  static constexpr size_t kDpt = kSt + f32_tile<kKeys, kLt>();
  static constexpr size_t kPt = kDpt + f32_tile<kKeys, kLt>();
  static constexpr size_t kDst = kPt + bf16_tile<kKeys, kLpt>();
  static constexpr size_t kLse = kDst + bf16_tile<kKeys, kLpt>();
  static constexpr size_t kD = kLse + f32_tile<kRows, 1>();
  static constexpr size_t kBytes = kD + f32_tile<kRows, 1>();
  static constexpr size_t kOutK = 0, kOutV = f32_tile<kKeys, kLo>();
  static_assert(kOutV + f32_tile<kKeys, kLo>() <= kBytes);
  // Phase A: one 16 × 16 block of Sᵀ and dPᵀ per warp; phase C: a quarter of the key rows
  // and half of the head dim per warp.
  static_assert((kKeys / 16) * (kRows / 16) == kWarps && kKeys / 16 * 2 == kWarps);
};

// dQ: 8 warps; a block owns 64 queries and walks key tiles of 32.
template <int kHd>
struct TcDq {
  static constexpr int kWarps = 8, kThreads = kWarps * kWarp;
  static constexpr int kRows = 64, kKeys = 32;
  static constexpr int kLd = kHd + kPadBf16;     // Q, dO, K, V (bf16)
  static constexpr int kLs = kKeys + kPadF32;    // S, dP (fp32)
  static constexpr int kLds = kKeys + kPadBf16;  // dS (bf16)
  static constexpr int kLo = kHd + kPadF32;      // dQ staged for the final store
  static constexpr size_t kQ = 0;
  static constexpr size_t kDo = kQ + bf16_tile<kRows, kLd>();
  static constexpr size_t kK = kDo + bf16_tile<kRows, kLd>();
  static constexpr size_t kV = kK + bf16_tile<kKeys, kLd>();
  static constexpr size_t kS = kV + bf16_tile<kKeys, kLd>();
  static constexpr size_t kDp = kS + f32_tile<kRows, kLs>();
  static constexpr size_t kDs = kDp + f32_tile<kRows, kLs>();
  static constexpr size_t kLse = kDs + bf16_tile<kRows, kLds>();
  static constexpr size_t kD = kLse + f32_tile<kRows, 1>();
  static constexpr size_t kBytes = kD + f32_tile<kRows, 1>();
  static constexpr size_t kOut = 0;
  static_assert(f32_tile<kRows, kLo>() <= kBytes);
  static_assert((kRows / 16) * (kKeys / 16) == kWarps && kRows / 16 * 2 == kWarps);
};

// The limit every block must stay within on sm_80 .. sm_90 (99 KB opt-in).
constexpr size_t kMaxShared = 99 * 1024;
static_assert(TcForward<128>::kBytes <= kMaxShared && TcDkDv<128>::kBytes <= kMaxShared &&
              TcDq<128>::kBytes <= kMaxShared);
static_assert(TcForward<64>::kBytes <= kMaxShared && TcDkDv<64>::kBytes <= kMaxShared &&
              TcDq<64>::kBytes <= kMaxShared);

// Rows [row0, row0 + kRows) of one head of a bf16 [B, S, heads, kHd] tensor into a tile of
// row stride kHd + kPadBf16, 16 bytes per load (the launcher checked the alignment). `head`
// is the element offset of (b, 0, head, 0), rows lie `stride` elements apart. Rows past the
// sequence are zero rather than stale: a masked P or dS of 0 times them must stay 0, which
// 0 · NaN would not.
template <int kRows, int kHd, int kThreadCount>
__device__ __forceinline__ void tc_load_rows(bf16* tile, const bf16* __restrict__ x, int64_t head,
                                             int64_t stride, int64_t row0, int64_t seq) {
  constexpr int kVec = 8, kChunks = kHd / kVec, kLd = kHd + kPadBf16;
  static_assert(kRows * kChunks % kThreadCount == 0);
#pragma unroll
  for (int i = 0; i < kRows * kChunks / kThreadCount; ++i) {
    const int e = int(threadIdx.x) + i * kThreadCount;
    const int r = e / kChunks, c = e % kChunks * kVec;
    const int64_t row = row0 + r;
    uint4 value = make_uint4(0, 0, 0, 0);
    if (row < seq) value = __ldg(reinterpret_cast<const uint4*>(x + head + row * stride + c));
    *reinterpret_cast<uint4*>(tile + r * kLd + c) = value;
  }
}

// lse (scaled to log2 units) and D of query rows [row0, row0 + kRows); zero past the sequence.
template <int kRows>
__device__ __forceinline__ void tc_load_row_stats(float* lse2_s, float* d_s, ConstArray lse,
                                                  const float* D, int64_t stats, int64_t row0,
                                                  int64_t seq) {
  for (int r = threadIdx.x; r < kRows; r += blockDim.x) {
    const bool real = row0 + r < seq;
    lse2_s[r] = real ? load(lse, stats + row0 + r) * kLog2e : 0.0f;
    d_s[r] = real ? D[stats + row0 + r] : 0.0f;
  }
}

// One warp's fp32 16 × 16 block C = A Bᵀ, stored at c with row stride ldc: the 16 rows of A
// at a and of B at b are kHd long, with row stride kLd.
template <int kHd, int kLd>
__device__ __forceinline__ void tc_abt(float* c, int ldc, const bf16* a, const bf16* b) {
  FragC acc;
  wmma::fill_fragment(acc, 0.0f);
#pragma unroll
  for (int d = 0; d < kHd / 16; ++d) {
    FragA fa;
    FragBt fb;
    wmma::load_matrix_sync(fa, a + 16 * d, kLd);
    wmma::load_matrix_sync(fb, b + 16 * d, kLd);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(c, acc, ldc, wmma::mem_row_major);
}

template <int kHd>
__global__ void __launch_bounds__(TcForward<kHd>::kThreads)
    tc_forward_kernel(Array out, Array lse, const bf16* __restrict__ q, const bf16* __restrict__ k,
                      const bf16* __restrict__ v, int64_t batch, int64_t seq, int64_t heads,
                      int64_t kv_heads, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 wmma needs sm_80; the launcher never picks this kernel below it
#else
  using C = TcForward<kHd>;
  constexpr int kLd = C::kLd, kLs = C::kLs, kLp = C::kLp, kKeys = C::kKeys;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* const k_s = reinterpret_cast<bf16*>(tc_smem + C::kK);
  bf16* const v_s = reinterpret_cast<bf16*>(tc_smem + C::kV);
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  float* const s_w = reinterpret_cast<float*>(tc_smem + C::kS) + warp * 16 * kLs;
  bf16* const p_w = reinterpret_cast<bf16*>(tc_smem + C::kP) + warp * 16 * kLp;

  // The last query tiles see the most keys: they go first, so the short ones fill the tail.
  const int64_t slots = batch * heads;
  const int64_t slot = blockIdx.x % slots;
  const int64_t q0 = (ceil_div(seq, C::kRows) - 1 - blockIdx.x / slots) * C::kRows;
  const int64_t b = slot / heads, h = slot % heads, g = h / (heads / kv_heads);
  const int64_t q_stride = heads * kHd, q_head = (b * seq * heads + h) * kHd;
  const int64_t kv_stride = kv_heads * kHd, kv_head = (b * seq * kv_heads + g) * kHd;

  // Q stays in registers as A fragments for the whole key walk.
  FragA q_frag[kHd / 16];
  {
    bf16* const q_stage = reinterpret_cast<bf16*>(tc_smem + C::kS);
    tc_load_rows<C::kRows, kHd, C::kThreads>(q_stage, q, q_head, q_stride, q0, seq);
    __syncthreads();
#pragma unroll
    for (int d = 0; d < kHd / 16; ++d)
      wmma::load_matrix_sync(q_frag[d], q_stage + warp * 16 * kLd + 16 * d, kLd);
  }
  FragC o[kHd / 16];
#pragma unroll
  for (int j = 0; j < kHd / 16; ++j) wmma::fill_fragment(o[j], 0.0f);

  // Softmax and rescaling: lanes 2r and 2r + 1 share row r of the warp's 16, each taking the
  // column pairs 4t + 2 half, + 1 (float2: a half-warp then touches 32 distinct banks). Both
  // lanes hold the row's max and sum, with identical bits (xor-1 shuffles are symmetric).
  const int r = lane / 2, half = lane % 2;
  const int64_t query = q0 + warp * 16 + r;
  // Keys after the query, or past the sequence (rows past it are never stored), are masked.
  const int64_t last_key = query < seq - 1 ? query : seq - 1;
  float row_max = -INFINITY, row_sum = 0.0f;

  const int64_t key_end = seq < q0 + C::kRows ? seq : q0 + C::kRows;
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeys) {
    __syncthreads();  // every warp is done with the previous K and V (and the staged Q)
    tc_load_rows<kKeys, kHd, C::kThreads>(k_s, k, kv_head, kv_stride, k0, seq);
    tc_load_rows<kKeys, kHd, C::kThreads>(v_s, v, kv_head, kv_stride, k0, seq);
    __syncthreads();

    // S = Q Kᵀ, 16 × kKeys per warp, unscaled.
#pragma unroll
    for (int n = 0; n < kKeys / 16; ++n) {
      FragC acc;
      wmma::fill_fragment(acc, 0.0f);
#pragma unroll
      for (int d = 0; d < kHd / 16; ++d) {
        FragBt fb;
        wmma::load_matrix_sync(fb, k_s + 16 * n * kLd + 16 * d, kLd);
        wmma::mma_sync(acc, q_frag[d], fb, acc);
      }
      wmma::store_matrix_sync(s_w + 16 * n, acc, kLs, wmma::mem_row_major);
    }
    __syncwarp();

    // Columns past `limit` are masked (at least column 0 is visible: k0 <= q0 <= query).
    const int limit = last_key - k0 < kKeys ? int(last_key - k0) : kKeys;
    const float* const s_row = s_w + r * kLs + 2 * half;
    float tile_max = -INFINITY;
#pragma unroll
    for (int t = 0; t < kKeys / 4; ++t) {
      const float2 x = *reinterpret_cast<const float2*>(s_row + 4 * t);
      const int col = 4 * t + 2 * half;
      tile_max = fmaxf(tile_max, col <= limit ? x.x * scale_log2 : -INFINITY);
      tile_max = fmaxf(tile_max, col + 1 <= limit ? x.y * scale_log2 : -INFINITY);
    }
    tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
    // Warp-uniform, so that the round trip below runs on whole warps. The first tile always
    // rescales (the max is -inf), which costs nothing then: the accumulator is zero.
    const bool rescale = __any_sync(0xffffffffu, tile_max > row_max + kRescaleLog2);
    float alpha = 1.0f;
    if (rescale) {
      const float new_max = fmaxf(row_max, tile_max);
      alpha = row_max == -INFINITY ? 0.0f : exp2f(row_max - new_max);
      row_max = new_max;
      row_sum *= alpha;
    }
    // A row with no visible key yet keeps max -inf; subtracting 0 keeps NaN out of its P.
    const float base = row_max == -INFINITY ? 0.0f : row_max;
    bf16* const p_row = p_w + r * kLp + 2 * half;
    float sum = 0.0f;
#pragma unroll
    for (int t = 0; t < kKeys / 4; ++t) {
      const float2 x = *reinterpret_cast<const float2*>(s_row + 4 * t);
      const int col = 4 * t + 2 * half;
      const float p0 = col <= limit ? exp2f(x.x * scale_log2 - base) : 0.0f;
      const float p1 = col + 1 <= limit ? exp2f(x.y * scale_log2 - base) : 0.0f;
      sum += p0;
      sum += p1;
      *reinterpret_cast<__nv_bfloat162*>(p_row + 4 * t) = __floats2bfloat162_rn(p0, p1);
    }
    row_sum += sum + __shfl_xor_sync(0xffffffffu, sum, 1);
    __syncwarp();  // P is written and the scores are read: s_w is free for the round trip

    if (rescale && k0 > 0) {
      // o *= alpha per row, through s_w: the accumulator's element layout is unspecified.
#pragma unroll
      for (int c = 0; c < kHd / kKeys; ++c) {
#pragma unroll
        for (int f = 0; f < kKeys / 16; ++f)
          wmma::store_matrix_sync(s_w + 16 * f, o[c * (kKeys / 16) + f], kLs, wmma::mem_row_major);
        __syncwarp();
        float* const row = s_w + r * kLs + 2 * half;
#pragma unroll
        for (int t = 0; t < kKeys / 4; ++t) {
          float2* const x = reinterpret_cast<float2*>(row + 4 * t);
          x->x *= alpha;
          x->y *= alpha;
        }
        __syncwarp();
#pragma unroll
        for (int f = 0; f < kKeys / 16; ++f)
          wmma::load_matrix_sync(o[c * (kKeys / 16) + f], s_w + 16 * f, kLs, wmma::mem_row_major);
        __syncwarp();  // read before the next chunk overwrites s_w
      }
    }

    // O += P V.
    FragA p_frag[kKeys / 16];
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) wmma::load_matrix_sync(p_frag[kk], p_w + 16 * kk, kLp);
#pragma unroll
    for (int j = 0; j < kHd / 16; ++j)
#pragma unroll
      for (int kk = 0; kk < kKeys / 16; ++kk) {
        FragB fb;
        wmma::load_matrix_sync(fb, v_s + 16 * kk * kLd + 16 * j, kLd);
        wmma::mma_sync(o[j], p_frag[kk], fb, o[j]);
      }
  }

  // out = O / sum, kKeys columns at a time through s_w (the last tile's P V read only p_w and
  // v_s, and s_w is this warp's alone). A row's largest score contributed exp2(0) = 1 when
  // its max was last set, so its sum is at least 1.
  const float inv_sum = 1.0f / row_sum;
#pragma unroll
  for (int c = 0; c < kHd / kKeys; ++c) {
#pragma unroll
    for (int f = 0; f < kKeys / 16; ++f)
      wmma::store_matrix_sync(s_w + 16 * f, o[c * (kKeys / 16) + f], kLs, wmma::mem_row_major);
    __syncwarp();
    float* const row = s_w + r * kLs + 2 * half;
#pragma unroll
    for (int t = 0; t < kKeys / 4; ++t) {
      float2* const x = reinterpret_cast<float2*>(row + 4 * t);
      x->x *= inv_sum;
      x->y *= inv_sum;
    }
    __syncwarp();
    // 32 consecutive columns of one row per step: coalesced stores.
#pragma unroll 4
    for (int i = 0; i < 16 * kKeys / kWarp; ++i) {
      const int e = lane + kWarp * i, rr = e / kKeys, col = e % kKeys;
      const int64_t row_index = q0 + warp * 16 + rr;
      if (row_index < seq)
        store(out, q_head + row_index * q_stride + c * kKeys + col, s_w[rr * kLs + col]);
    }
    __syncwarp();
  }
  if (half == 0 && query < seq)
    store(lse, (b * heads + h) * seq + query, (row_max + log2f(row_sum)) * kLn2);
#endif
}

// Pass 2 on tensor cores: dK and dV of one tile of 64 keys. Two blocks per SM (128 registers
// a thread, which the shared memory allows too) keep one block computing while the other loads.
template <int kHd>
__global__ void __launch_bounds__(TcDkDv<kHd>::kThreads, 2)
    tc_dkdv_kernel(Array dk, Array dv, const bf16* __restrict__ dout, ConstArray lse,
                   const bf16* __restrict__ q, const bf16* __restrict__ k,
                   const bf16* __restrict__ v, const float* __restrict__ D, int64_t batch,
                   int64_t seq, int64_t heads, int64_t kv_heads, float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 wmma needs sm_80; the launcher never picks this kernel below it
#else
  using C = TcDkDv<kHd>;
  constexpr int kLd = C::kLd, kLt = C::kLt, kLpt = C::kLpt, kLo = C::kLo;
  constexpr int kRows = C::kRows, kKeys = C::kKeys;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* const k_s = reinterpret_cast<bf16*>(tc_smem + C::kK);
  bf16* const v_s = reinterpret_cast<bf16*>(tc_smem + C::kV);
  bf16* const q_s = reinterpret_cast<bf16*>(tc_smem + C::kQ);
  bf16* const do_s = reinterpret_cast<bf16*>(tc_smem + C::kDo);
  float* const st_s = reinterpret_cast<float*>(tc_smem + C::kSt);
  float* const dpt_s = reinterpret_cast<float*>(tc_smem + C::kDpt);
  bf16* const pt_s = reinterpret_cast<bf16*>(tc_smem + C::kPt);
  bf16* const dst_s = reinterpret_cast<bf16*>(tc_smem + C::kDst);
  float* const lse2_s = reinterpret_cast<float*>(tc_smem + C::kLse);
  float* const d_s = reinterpret_cast<float*>(tc_smem + C::kD);

  // The first key tiles meet the most queries: they go first.
  const int64_t slots = batch * kv_heads;
  const int64_t slot = blockIdx.x % slots;
  const int64_t k0 = int64_t(blockIdx.x / slots) * kKeys;
  const int64_t b = slot / kv_heads, g = slot % kv_heads, group = heads / kv_heads;
  const int64_t kv_stride = kv_heads * kHd, kv_head = (b * seq * kv_heads + g) * kHd;
  const int64_t q_stride = heads * kHd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // Phases A, B: this warp's 16 × 16 block (key block kb, query block qb) of Sᵀ and dPᵀ.
  // Phase C: key rows 16 kb.. of dK and dV, head-dim columns from col0 (half of them).
  const int kb = warp % (kKeys / 16), qb = warp / (kKeys / 16);
  const int col0 = warp / (kKeys / 16) * (kHd / 2);

  tc_load_rows<kKeys, kHd, C::kThreads>(k_s, k, kv_head, kv_stride, k0, seq);
  tc_load_rows<kKeys, kHd, C::kThreads>(v_s, v, kv_head, kv_stride, k0, seq);
  FragC dk_acc[kHd / 32], dv_acc[kHd / 32];
#pragma unroll
  for (int c = 0; c < kHd / 32; ++c) {
    wmma::fill_fragment(dk_acc[c], 0.0f);
    wmma::fill_fragment(dv_acc[c], 0.0f);
  }
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const int64_t q_head = (b * seq * heads + h) * kHd, stats = (b * heads + h) * seq;
    // Queries before k0 see none of the tile's keys (kRows divides kKeys, so k0 starts a tile).
    for (int64_t q0 = k0; q0 < seq; q0 += kRows) {
      __syncthreads();  // phase C of the previous tile is done with q_s, do_s, pt_s, dst_s
      tc_load_rows<kRows, kHd, C::kThreads>(q_s, q, q_head, q_stride, q0, seq);
      tc_load_rows<kRows, kHd, C::kThreads>(do_s, dout, q_head, q_stride, q0, seq);
      tc_load_row_stats<kRows>(lse2_s, d_s, lse, D, stats, q0, seq);
      __syncthreads();

      // Phase A: Sᵀ = K Qᵀ and dPᵀ = V dOᵀ for this warp's block.
      float* const st_w = st_s + 16 * kb * kLt + 16 * qb;
      float* const dpt_w = dpt_s + 16 * kb * kLt + 16 * qb;
      tc_abt<kHd, kLd>(st_w, kLt, k_s + 16 * kb * kLd, q_s + 16 * qb * kLd);
      tc_abt<kHd, kLd>(dpt_w, kLt, v_s + 16 * kb * kLd, do_s + 16 * qb * kLd);
      __syncwarp();
      // Phase B, on the same block: Pᵀ = exp(scale s - lse), dSᵀ = Pᵀ (dPᵀ - D). Key k0 + kr
      // is visible to query q0 + qi iff kr - qi <= q0 - k0 and the query exists (so a key past
      // the sequence never is).
      const int64_t diag = q0 - k0, queries = seq - q0;
#pragma unroll
      for (int i = 0; i < 16 * 16 / kWarp; ++i) {
        const int e = lane + kWarp * i, rr = e / 16, cc = e % 16;
        const int kr = 16 * kb + rr, qi = 16 * qb + cc;
        const bool visible = kr - qi <= diag && qi < queries;
        const float p = visible ? exp2f(st_w[rr * kLt + cc] * scale_log2 - lse2_s[qi]) : 0.0f;
        const float ds = p * (dpt_w[rr * kLt + cc] - d_s[qi]);
        pt_s[(16 * kb + rr) * kLpt + qi] = __float2bfloat16_rn(p);
        dst_s[(16 * kb + rr) * kLpt + qi] = __float2bfloat16_rn(ds);
      }
      __syncthreads();

      // Phase C: dV += Pᵀ dO and dK += dSᵀ Q over this tile's queries.
#pragma unroll
      for (int qk = 0; qk < kRows / 16; ++qk) {
        FragA fp, fds;
        wmma::load_matrix_sync(fp, pt_s + 16 * kb * kLpt + 16 * qk, kLpt);
        wmma::load_matrix_sync(fds, dst_s + 16 * kb * kLpt + 16 * qk, kLpt);
#pragma unroll
        for (int c = 0; c < kHd / 32; ++c) {
          FragB fdo, fq;
          wmma::load_matrix_sync(fdo, do_s + 16 * qk * kLd + col0 + 16 * c, kLd);
          wmma::mma_sync(dv_acc[c], fp, fdo, dv_acc[c]);
          wmma::load_matrix_sync(fq, q_s + 16 * qk * kLd + col0 + 16 * c, kLd);
          wmma::mma_sync(dk_acc[c], fds, fq, dk_acc[c]);
        }
      }
    }
  }

  // This block alone owns these rows of dk and dv: stage them (over the dead tiles) and add.
  float* const out_k = reinterpret_cast<float*>(tc_smem + C::kOutK);
  float* const out_v = reinterpret_cast<float*>(tc_smem + C::kOutV);
  __syncthreads();  // every warp's phase C is done with the tiles the staging overwrites
#pragma unroll
  for (int c = 0; c < kHd / 32; ++c) {
    // A uniform scale of every element: independent of the fragment layout.
#pragma unroll
    for (int i = 0; i < dk_acc[c].num_elements; ++i) dk_acc[c].x[i] *= scale;
    wmma::store_matrix_sync(out_k + 16 * kb * kLo + col0 + 16 * c, dk_acc[c], kLo,
                            wmma::mem_row_major);
    wmma::store_matrix_sync(out_v + 16 * kb * kLo + col0 + 16 * c, dv_acc[c], kLo,
                            wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kKeys * kHd; e += C::kThreads) {
    const int rr = e / kHd, d = e % kHd;
    const int64_t key = k0 + rr;
    if (key >= seq) continue;
    const int64_t idx = kv_head + key * kv_stride + d;
    store(dk, idx, out_k[rr * kLo + d]);  // this block is the only writer of its keys
    store(dv, idx, out_v[rr * kLo + d]);
  }
#endif
}

// Pass 3 on tensor cores: dQ of one tile of 64 queries.
template <int kHd>
__global__ void __launch_bounds__(TcDq<kHd>::kThreads, 2)
    tc_dq_kernel(Array dq, const bf16* __restrict__ dout, ConstArray lse,
                 const bf16* __restrict__ q, const bf16* __restrict__ k, const bf16* __restrict__ v,
                 const float* __restrict__ D, int64_t batch, int64_t seq, int64_t heads,
                 int64_t kv_heads, float scale, float scale_log2) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();  // bf16 wmma needs sm_80; the launcher never picks this kernel below it
#else
  using C = TcDq<kHd>;
  constexpr int kLd = C::kLd, kLs = C::kLs, kLds = C::kLds, kLo = C::kLo;
  constexpr int kRows = C::kRows, kKeys = C::kKeys;
  extern __shared__ __align__(128) unsigned char tc_smem[];
  bf16* const q_s = reinterpret_cast<bf16*>(tc_smem + C::kQ);
  bf16* const do_s = reinterpret_cast<bf16*>(tc_smem + C::kDo);
  bf16* const k_s = reinterpret_cast<bf16*>(tc_smem + C::kK);
  bf16* const v_s = reinterpret_cast<bf16*>(tc_smem + C::kV);
  float* const s_s = reinterpret_cast<float*>(tc_smem + C::kS);
  float* const dp_s = reinterpret_cast<float*>(tc_smem + C::kDp);
  bf16* const ds_s = reinterpret_cast<bf16*>(tc_smem + C::kDs);
  float* const lse2_s = reinterpret_cast<float*>(tc_smem + C::kLse);
  float* const d_s = reinterpret_cast<float*>(tc_smem + C::kD);

  const int64_t slots = batch * heads;
  const int64_t slot = blockIdx.x % slots;
  const int64_t q0 = (ceil_div(seq, kRows) - 1 - blockIdx.x / slots) * kRows;
  const int64_t b = slot / heads, h = slot % heads, g = h / (heads / kv_heads);
  const int64_t q_stride = heads * kHd, q_head = (b * seq * heads + h) * kHd;
  const int64_t kv_stride = kv_heads * kHd, kv_head = (b * seq * kv_heads + g) * kHd;
  const int64_t stats = (b * heads + h) * seq;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  // Phases A, B: this warp's 16 × 16 block (query block qb, key block kb) of S and dP.
  // Phase C: query rows 16 qb.. of dQ, head-dim columns from col0 (half of them).
  const int qb = warp % (kRows / 16), kb = warp / (kRows / 16);
  const int col0 = warp / (kRows / 16) * (kHd / 2);

  tc_load_rows<kRows, kHd, C::kThreads>(q_s, q, q_head, q_stride, q0, seq);
  tc_load_rows<kRows, kHd, C::kThreads>(do_s, dout, q_head, q_stride, q0, seq);
  tc_load_row_stats<kRows>(lse2_s, d_s, lse, D, stats, q0, seq);
  FragC acc[kHd / 32];
#pragma unroll
  for (int c = 0; c < kHd / 32; ++c) wmma::fill_fragment(acc[c], 0.0f);

  const int64_t key_end = seq < q0 + kRows ? seq : q0 + kRows;
  for (int64_t k0 = 0; k0 < key_end; k0 += kKeys) {
    __syncthreads();  // phase C of the previous tile is done with k_s and ds_s
    tc_load_rows<kKeys, kHd, C::kThreads>(k_s, k, kv_head, kv_stride, k0, seq);
    tc_load_rows<kKeys, kHd, C::kThreads>(v_s, v, kv_head, kv_stride, k0, seq);
    __syncthreads();

    // Phase A: S = Q Kᵀ and dP = dO Vᵀ for this warp's block.
    float* const s_w = s_s + 16 * qb * kLs + 16 * kb;
    float* const dp_w = dp_s + 16 * qb * kLs + 16 * kb;
    tc_abt<kHd, kLd>(s_w, kLs, q_s + 16 * qb * kLd, k_s + 16 * kb * kLd);
    tc_abt<kHd, kLd>(dp_w, kLs, do_s + 16 * qb * kLd, v_s + 16 * kb * kLd);
    __syncwarp();
    // Phase B, on the same block: dS = P (dP - D) with P = exp(scale s - lse); the mask as in
    // pass 2.
    const int64_t diag = q0 - k0, queries = seq - q0;
#pragma unroll
    for (int i = 0; i < 16 * 16 / kWarp; ++i) {
      const int e = lane + kWarp * i, rr = e / 16, cc = e % 16;
      const int qi = 16 * qb + rr, kc = 16 * kb + cc;
      const bool visible = kc - qi <= diag && qi < queries;
      const float p = visible ? exp2f(s_w[rr * kLs + cc] * scale_log2 - lse2_s[qi]) : 0.0f;
      ds_s[qi * kLds + 16 * kb + cc] = __float2bfloat16_rn(p * (dp_w[rr * kLs + cc] - d_s[qi]));
    }
    __syncthreads();

    // Phase C: dQ += dS K over this tile's keys.
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk) {
      FragA fds;
      wmma::load_matrix_sync(fds, ds_s + 16 * qb * kLds + 16 * kk, kLds);
#pragma unroll
      for (int c = 0; c < kHd / 32; ++c) {
        FragB fk;
        wmma::load_matrix_sync(fk, k_s + 16 * kk * kLd + col0 + 16 * c, kLd);
        wmma::mma_sync(acc[c], fds, fk, acc[c]);
      }
    }
  }

  // This block alone owns these rows of dq: stage them (over the dead tiles) and add.
  float* const out_q = reinterpret_cast<float*>(tc_smem + C::kOut);
  __syncthreads();  // every warp's phase C is done with the tiles the staging overwrites
#pragma unroll
  for (int c = 0; c < kHd / 32; ++c) {
#pragma unroll
    for (int i = 0; i < acc[c].num_elements; ++i) acc[c].x[i] *= scale;  // uniform: layout-free
    wmma::store_matrix_sync(out_q + 16 * qb * kLo + col0 + 16 * c, acc[c], kLo,
                            wmma::mem_row_major);
  }
  __syncthreads();
  for (int e = threadIdx.x; e < kRows * kHd; e += C::kThreads) {
    const int rr = e / kHd, d = e % kHd;
    const int64_t row = q0 + rr;
    if (row >= seq) continue;
    const int64_t idx = q_head + row * q_stride + d;
    store(dq, idx, out_q[rr * kLo + d]);  // this block is the only writer of its queries
  }
#endif
}

// Whether the tensor-core kernels take this call: bf16 operands, 16-byte aligned (the tile
// loads are 16 bytes wide; every row offset is a multiple of hd, itself of 8 elements), head
// dim 64 or 128, on an sm_80+ device.
bool tc_eligible(int64_t hd, std::initializer_list<ConstArray> operands) {
  if (hd != 64 && hd != 128) return false;
  for (const ConstArray& a : operands)
    if (a.dtype != DType::bf16 || reinterpret_cast<uintptr_t>(a.data) % 16 != 0) return false;
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  return major >= 8;
}

const bf16* bf16_data(ConstArray a) { return static_cast<const bf16*>(a.data); }

template <int kHd>
void tc_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k, ConstArray v,
                int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, float scale) {
  using C = TcForward<kHd>;
  const auto kernel = tc_forward_kernel<kHd>;
  allow_shared(kernel, C::kBytes);
  const int64_t blocks = ceil_div(seq, C::kRows) * batch * heads;
  kernel<<<unsigned(blocks), C::kThreads, C::kBytes, stream>>>(out, lse, bf16_data(q), bf16_data(k),
                                                               bf16_data(v), batch, seq, heads,
                                                               kv_heads, scale * kLog2e);
}

template <int kHd>
void tc_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout, ConstArray lse,
                 ConstArray q, ConstArray k, ConstArray v, const float* D, int64_t batch,
                 int64_t seq, int64_t heads, int64_t kv_heads, float scale) {
  using P2 = TcDkDv<kHd>;
  const auto dkdv = tc_dkdv_kernel<kHd>;
  allow_shared(dkdv, P2::kBytes);
  const int64_t dkdv_blocks = ceil_div(seq, P2::kKeys) * batch * kv_heads;
  dkdv<<<unsigned(dkdv_blocks), P2::kThreads, P2::kBytes, stream>>>(
      dk, dv, bf16_data(dout), lse, bf16_data(q), bf16_data(k), bf16_data(v), D, batch, seq, heads,
      kv_heads, scale, scale * kLog2e);

  using P3 = TcDq<kHd>;
  const auto dq_kernel = tc_dq_kernel<kHd>;
  allow_shared(dq_kernel, P3::kBytes);
  const int64_t dq_blocks = ceil_div(seq, P3::kRows) * batch * heads;
  dq_kernel<<<unsigned(dq_blocks), P3::kThreads, P3::kBytes, stream>>>(
      dq, bf16_data(dout), lse, bf16_data(q), bf16_data(k), bf16_data(v), D, batch, seq, heads,
      kv_heads, scale, scale * kLog2e);
}

}  // namespace

bool mma_attention_eligible(int64_t hd, std::initializer_list<ConstArray> operands) {
  return tc_eligible(hd, operands);
}

void mma_attention_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k,
                           ConstArray v, int64_t batch, int64_t seq, int64_t heads,
                           int64_t kv_heads, int64_t hd, float scale) {
  if (hd == 64)
    tc_forward<64>(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, scale);
  else
    tc_forward<128>(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, scale);
}

void mma_attention_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout,
                            ConstArray lse, ConstArray q, ConstArray k, ConstArray v,
                            const float* D, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int64_t hd, float scale) {
  if (hd == 64)
    tc_backward<64>(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads, scale);
  else
    tc_backward<128>(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads, scale);
}

}  // namespace bottle::cuda
