// Causal attention with GQA, FlashAttention-2 style: q, out [B, S, H, hd]; k, v [B, S, Hkv, hd];
// query head h reads kv head h / (H / Hkv); score_ij = q_i·k_j / sqrt(hd) for j <= i.
//
// Forward: one block per (batch, head, tile of kBr queries). The query tile is staged in shared
// memory once; the block then walks the key/value tiles of kBc keys up to the causal limit.
// Per tile: the kBr × kBc scores go to shared memory, each row's running max and sum are
// updated (online softmax), and the fp32 output accumulator, held in registers, is rescaled
// by exp(old max - new max) before P V is added. At the end out = acc / sum and
// lse = max + log(sum); no [S, S] matrix ever exists.
//
// Backward recomputes P = exp(s - lse) tile by tile, in three kernels:
//  1. D_i = dout_i · out_i for every query row (the softmax Jacobian's row term), into scratch.
//  2. One block per (batch, kv head, tile of kBc keys) accumulates dV = Σ Pᵀ dO and
//     dK = scale Σ dSᵀ Q for its keys over every query head of its group and every query
//     tile at or after the key tile, with dS_ij = P_ij (dO_i·v_j - D_i).
//  3. One block per (batch, head, tile of kBr queries) accumulates dQ = scale Σ dS K over the
//     key tiles up to the causal limit.
// FlashAttention-2 gets dQ inside pass 2 with atomic adds from every key tile. Here every
// gradient row has exactly one owning block, which sums its contributions in an order fixed
// by the shape and adds the total into dq/dk/dv with a plain read-modify-write: no atomics,
// so results repeat bit for bit, for the price of computing the scores once more in pass 3.
//
// Thread mapping, 256 threads a block. A score tile of R × C entries is covered by a 16 × 16
// grid of threads, each computing (R/16) × (C/16) entries 16 apart (register blocking). An
// output tile (rows × head dim: O, dQ, dK, dV) is covered by warps over rows and lanes over
// columns: warp w owns rows w, w + 8, ..., lane l columns l, l + 32, ..., so each step a warp
// reads one broadcast weight per row and 32 consecutive floats of a row.
//
// Shared memory holds fp32 tiles whatever the inputs' dtype. Rows are padded by one float so
// that the 16 threads reading the same column of 16 different rows hit 16 different banks.
// The head dim is rounded up to a bucket (32, 64, 128, 256) and zero padded, which changes no
// score and no stored output; the tile sizes per bucket keep every kernel under 76 KB of shared
// memory, within the 99 KB a block may have on any sm_80+ GPU, and allow two or three blocks
// per SM on A100/H100.
//
// attention.cu chooses between these kernels and the tensor-core ones of attention_mma.cu.
#include <cstddef>
#include <cstdint>

#include "backend/cuda/attention.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / kWarp;
// Score tiles: a kGrid × kGrid grid of threads.
constexpr int kGrid = 16;
static_assert(kGrid * kGrid == kThreads);

// Tile sizes for a head-dim bucket: forward (kFwdRows queries × kFwdKeys keys) and both
// backward passes (kBwdRows queries × kBwdKeys keys). Larger buckets take smaller tiles to
// bound shared memory and registers.
template <int Hd>
struct Config;
template <>
struct Config<32> {
  static constexpr int kHd = 32, kFwdRows = 64, kFwdKeys = 64, kBwdRows = 64, kBwdKeys = 64;
};
template <>
struct Config<64> {
  static constexpr int kHd = 64, kFwdRows = 64, kFwdKeys = 64, kBwdRows = 32, kBwdKeys = 64;
};
template <>
struct Config<128> {
  static constexpr int kHd = 128, kFwdRows = 64, kFwdKeys = 32, kBwdRows = 32, kBwdKeys = 32;
};
template <>
struct Config<256> {
  static constexpr int kHd = 256, kFwdRows = 32, kFwdKeys = 16, kBwdRows = 16, kBwdKeys = 16;
};

// Shared-memory floats of each kernel; the kernels carve their tiles in this order.
template <class C>
constexpr size_t forward_floats() {
  constexpr int ld = C::kHd + 1, ls = C::kFwdKeys + 1;
  // Q; K and V; scores.
  return size_t(C::kFwdRows) * ld + 2 * size_t(C::kFwdKeys) * ld + size_t(C::kFwdRows) * ls;
}
template <class C>
constexpr size_t dkdv_floats() {
  constexpr int ld = C::kHd + 1, ls = C::kBwdKeys + 1;
  // K and V; Q and dO; P and dS; lse and D per query row.
  return 2 * size_t(C::kBwdKeys) * ld + 2 * size_t(C::kBwdRows) * ld +
         2 * size_t(C::kBwdRows) * ls + 2 * size_t(C::kBwdRows);
}
template <class C>
constexpr size_t dq_floats() {
  constexpr int ld = C::kHd + 1, ls = C::kBwdKeys + 1;
  // Q and dO; K and V; dS; lse and D per query row.
  return 2 * size_t(C::kBwdRows) * ld + 2 * size_t(C::kBwdKeys) * ld + size_t(C::kBwdRows) * ls +
         2 * size_t(C::kBwdRows);
}

// Rows [row0, row0 + kRows) of one head of a [B, S, heads, hd] tensor into a kRows × kHd fp32
// tile of row stride kHd + 1. `head` is the element offset of (b, 0, head, 0) and rows lie
// `stride` elements apart. Rows past the sequence and columns past hd are zero, so that they
// add nothing to any dot product.
template <int kRows, int kHd>
__device__ __forceinline__ void load_tile(float* tile, ConstArray x, int64_t head, int64_t stride,
                                          int64_t row0, int64_t seq, int hd) {
  for (int e = threadIdx.x; e < kRows * kHd; e += kThreads) {
    const int r = e / kHd, d = e % kHd;
    const int64_t row = row0 + r;
    tile[r * (kHd + 1) + d] = row < seq && d < hd ? load(x, head + row * stride + d) : 0.0f;
  }
}

// acc[i][j] += Σ_{d < hd} a[r][d] b[c][d] for the thread's score entries r = tr + 16 i,
// c = tc + 16 j (tr, tc = its row and column in the 16 × 16 grid). a is kR × (kHd + 1),
// b kC × (kHd + 1).
template <int kR, int kC, int kHd>
__device__ __forceinline__ void tile_dot(float (&acc)[kR / kGrid][kC / kGrid], const float* a,
                                         const float* b, int hd) {
  const int tr = threadIdx.x / kGrid, tc = threadIdx.x % kGrid;
#pragma unroll 4
  for (int d = 0; d < hd; ++d) {
    float av[kR / kGrid], bv[kC / kGrid];
#pragma unroll
    for (int i = 0; i < kR / kGrid; ++i) av[i] = a[(tr + kGrid * i) * (kHd + 1) + d];
#pragma unroll
    for (int j = 0; j < kC / kGrid; ++j) bv[j] = b[(tc + kGrid * j) * (kHd + 1) + d];
#pragma unroll
    for (int i = 0; i < kR / kGrid; ++i)
#pragma unroll
      for (int j = 0; j < kC / kGrid; ++j) acc[i][j] += av[i] * bv[j];
  }
}

// acc[i][j] += Σ_{k < kK} w[row * w_row + k * w_k] x[k][col] for the thread's output entries
// row = warp + 8 i, col = lane + 32 j. x is kK × (kHd + 1); w_row and w_k let one helper take
// P (rows × keys) for P V and dS K, and its transpose for Pᵀ dO and dSᵀ Q.
template <int kRows, int kK, int kHd>
__device__ __forceinline__ void tile_accumulate(float (&acc)[kRows / kWarps][kHd / kWarp],
                                                const float* w, int w_row, int w_k,
                                                const float* x) {
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
#pragma unroll 4
  for (int k = 0; k < kK; ++k) {
    float wv[kRows / kWarps], xv[kHd / kWarp];
#pragma unroll
    for (int i = 0; i < kRows / kWarps; ++i) wv[i] = w[(warp + kWarps * i) * w_row + k * w_k];
#pragma unroll
    for (int j = 0; j < kHd / kWarp; ++j) xv[j] = x[k * (kHd + 1) + lane + kWarp * j];
#pragma unroll
    for (int i = 0; i < kRows / kWarps; ++i)
#pragma unroll
      for (int j = 0; j < kHd / kWarp; ++j) acc[i][j] += wv[i] * xv[j];
  }
}

template <class C>
__global__ void __launch_bounds__(kThreads)
    attention_forward_kernel(Array out, Array lse, ConstArray q, ConstArray k, ConstArray v,
                             int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int hd,
                             float scale) {
  constexpr int kHd = C::kHd, kBr = C::kFwdRows, kBc = C::kFwdKeys;
  constexpr int kLd = kHd + 1, kLs = kBc + 1;
  constexpr int kRowsPerWarp = kBr / kWarps;
  extern __shared__ float smem[];
  float* const q_s = smem;
  float* const k_s = q_s + kBr * kLd;
  float* const v_s = k_s + kBc * kLd;
  float* const s_s = v_s + kBc * kLd;

  // The last query tiles see the most keys: they go first, so the short ones fill the tail.
  const int64_t slots = batch * heads;
  const int64_t slot = blockIdx.x % slots;
  const int64_t q0 = (ceil_div(seq, kBr) - 1 - blockIdx.x / slots) * kBr;
  const int64_t b = slot / heads, h = slot % heads, g = h / (heads / kv_heads);
  const int64_t q_stride = heads * hd, q_head = (b * seq * heads + h) * hd;
  const int64_t kv_stride = kv_heads * hd, kv_head = (b * seq * kv_heads + g) * hd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int tr = threadIdx.x / kGrid, tc = threadIdx.x % kGrid;

  load_tile<kBr, kHd>(q_s, q, q_head, q_stride, q0, seq, hd);
  // Warp w owns query rows w + 8 i both for the softmax and for the output accumulator, so the
  // running max and sum of a row live in that warp's registers (every lane holds the same
  // values: the butterfly reductions give all lanes identical bits) and never go through
  // shared memory.
  float row_max[kRowsPerWarp], row_sum[kRowsPerWarp];
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    row_max[i] = -INFINITY;
    row_sum[i] = 0.0f;
  }
  float acc[kRowsPerWarp][kHd / kWarp] = {};
  // Keys past the tile's last query are masked for all its rows.
  const int64_t key_end = seq < q0 + kBr ? seq : q0 + kBr;
  for (int64_t k0 = 0; k0 < key_end; k0 += kBc) {
    __syncthreads();  // the previous tile's readers of k_s, v_s, s_s are done
    load_tile<kBc, kHd>(k_s, k, kv_head, kv_stride, k0, seq, hd);
    load_tile<kBc, kHd>(v_s, v, kv_head, kv_stride, k0, seq, hd);
    __syncthreads();
    {
      float s[kBr / kGrid][kBc / kGrid] = {};
      tile_dot<kBr, kBc, kHd>(s, q_s, k_s, hd);
#pragma unroll
      for (int i = 0; i < kBr / kGrid; ++i)
#pragma unroll
        for (int j = 0; j < kBc / kGrid; ++j) {
          const int r = tr + kGrid * i, c = tc + kGrid * j;
          // col <= row also excludes keys past the sequence for every real query row.
          const bool visible = k0 + c <= q0 + r && k0 + c < seq;
          s_s[r * kLs + c] = visible ? s[i][j] * scale : -INFINITY;
        }
    }
    __syncthreads();
    // Online softmax: scores become P = exp(s - new max) in place, and the accumulator is
    // rescaled to the new max.
#pragma unroll
    for (int i = 0; i < kRowsPerWarp; ++i) {
      float* const row = s_s + (warp + kWarps * i) * kLs;
      float m = -INFINITY;
      for (int c = lane; c < kBc; c += kWarp) m = fmaxf(m, row[c]);
      const float new_max = fmaxf(row_max[i], warp_max(m));
      // A row that has seen no visible key keeps max -inf; subtracting 0 instead keeps
      // exp(-inf - -inf) = NaN out and leaves its P at exactly 0.
      const float base = new_max == -INFINITY ? 0.0f : new_max;
      float sum = 0.0f;
      for (int c = lane; c < kBc; c += kWarp) {
        const float p = expf(row[c] - base);
        row[c] = p;
        sum += p;
      }
      const float alpha = expf(row_max[i] - base);  // 0 on the row's first visible tile
      row_max[i] = new_max;
      row_sum[i] = row_sum[i] * alpha + warp_sum(sum);
#pragma unroll
      for (int j = 0; j < kHd / kWarp; ++j) acc[i][j] *= alpha;
    }
    __syncthreads();
    tile_accumulate<kBr, kBc, kHd>(acc, s_s, kLs, 1, v_s);
  }
#pragma unroll
  for (int i = 0; i < kRowsPerWarp; ++i) {
    const int64_t row = q0 + warp + kWarps * i;
    if (row >= seq) continue;
#pragma unroll
    for (int j = 0; j < kHd / kWarp; ++j) {
      const int d = lane + kWarp * j;
      // The row's largest score contributed exp(0) = 1, so its sum is at least 1.
      if (d < hd) store(out, q_head + row * q_stride + d, acc[i][j] / row_sum[i]);
    }
    if (lane == 0) store(lse, (b * heads + h) * seq + row, row_max[i] + logf(row_sum[i]));
  }
}

// D[(b H + h) S + i] = Σ_d dout[b, i, h, d] out[b, i, h, d], one warp per row, summed in an
// order fixed by hd.
__global__ void __launch_bounds__(kThreads)
    attention_row_dot_kernel(float* D, ConstArray dout, ConstArray out, int64_t rows, int64_t seq,
                             int64_t heads, int hd) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps = int64_t(gridDim.x) * kWarps;
  // n is uniform over a warp, so every lane reaches warp_sum.
  for (int64_t n = int64_t(blockIdx.x) * kWarps + threadIdx.x / kWarp; n < rows; n += warps) {
    float s = 0.0f;
    for (int d = lane; d < hd; d += kWarp) s += load(dout, n * hd + d) * load(out, n * hd + d);
    s = warp_sum(s);
    if (lane == 0) {
      const int64_t b = n / (seq * heads), i = n / heads % seq, h = n % heads;
      D[(b * heads + h) * seq + i] = s;
    }
  }
}

// Pass 2: dK and dV of one key tile.
template <class C>
__global__ void __launch_bounds__(kThreads)
    attention_dkdv_kernel(Array dk, Array dv, ConstArray dout, ConstArray lse, ConstArray q,
                          ConstArray k, ConstArray v, const float* D, int64_t batch, int64_t seq,
                          int64_t heads, int64_t kv_heads, int hd, float scale) {
  constexpr int kHd = C::kHd, kBr = C::kBwdRows, kBc = C::kBwdKeys;
  constexpr int kLd = kHd + 1, kLs = kBc + 1;
  extern __shared__ float smem[];
  float* const k_s = smem;
  float* const v_s = k_s + kBc * kLd;
  float* const q_s = v_s + kBc * kLd;
  float* const do_s = q_s + kBr * kLd;
  float* const p_s = do_s + kBr * kLd;
  float* const ds_s = p_s + kBr * kLs;
  float* const lse_s = ds_s + kBr * kLs;
  float* const d_s = lse_s + kBr;

  // The first key tiles meet the most queries: they go first.
  const int64_t slots = batch * kv_heads;
  const int64_t slot = blockIdx.x % slots;
  const int64_t k0 = int64_t(blockIdx.x / slots) * kBc;
  const int64_t b = slot / kv_heads, g = slot % kv_heads, group = heads / kv_heads;
  const int64_t kv_stride = kv_heads * hd, kv_head = (b * seq * kv_heads + g) * hd;
  const int64_t q_stride = heads * hd;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int tr = threadIdx.x / kGrid, tc = threadIdx.x % kGrid;

  load_tile<kBc, kHd>(k_s, k, kv_head, kv_stride, k0, seq, hd);
  load_tile<kBc, kHd>(v_s, v, kv_head, kv_stride, k0, seq, hd);
  float dk_acc[kBc / kWarps][kHd / kWarp] = {};
  float dv_acc[kBc / kWarps][kHd / kWarp] = {};
  for (int64_t h = g * group; h < (g + 1) * group; ++h) {
    const int64_t q_head = (b * seq * heads + h) * hd, stats = (b * heads + h) * seq;
    // Queries before k0 see none of the tile's keys.
    for (int64_t q0 = k0 / kBr * kBr; q0 < seq; q0 += kBr) {
      __syncthreads();  // the previous tile's readers of q_s, do_s, p_s, ds_s are done
      load_tile<kBr, kHd>(q_s, q, q_head, q_stride, q0, seq, hd);
      load_tile<kBr, kHd>(do_s, dout, q_head, q_stride, q0, seq, hd);
      for (int r = threadIdx.x; r < kBr; r += kThreads) {
        const bool real = q0 + r < seq;
        lse_s[r] = real ? load(lse, stats + q0 + r) : 0.0f;
        d_s[r] = real ? D[stats + q0 + r] : 0.0f;
      }
      __syncthreads();
      {
        float s[kBr / kGrid][kBc / kGrid] = {}, dp[kBr / kGrid][kBc / kGrid] = {};
        tile_dot<kBr, kBc, kHd>(s, q_s, k_s, hd);
        tile_dot<kBr, kBc, kHd>(dp, do_s, v_s, hd);
#pragma unroll
        for (int i = 0; i < kBr / kGrid; ++i)
#pragma unroll
          for (int j = 0; j < kBc / kGrid; ++j) {
            const int r = tr + kGrid * i, c = tc + kGrid * j;
            // col <= row < seq: a key past the sequence is never visible.
            const bool visible = k0 + c <= q0 + r && q0 + r < seq;
            const float p = visible ? expf(s[i][j] * scale - lse_s[r]) : 0.0f;
            p_s[r * kLs + c] = p;
            ds_s[r * kLs + c] = p * (dp[i][j] - d_s[r]);
          }
      }
      __syncthreads();
      tile_accumulate<kBc, kBr, kHd>(dv_acc, p_s, 1, kLs, do_s);
      tile_accumulate<kBc, kBr, kHd>(dk_acc, ds_s, 1, kLs, q_s);
    }
  }
  // This block alone owns these rows of dk and dv.
#pragma unroll
  for (int i = 0; i < kBc / kWarps; ++i) {
    const int64_t key = k0 + warp + kWarps * i;
    if (key >= seq) continue;
#pragma unroll
    for (int j = 0; j < kHd / kWarp; ++j) {
      const int d = lane + kWarp * j;
      if (d >= hd) continue;
      const int64_t e = kv_head + key * kv_stride + d;
      store(dk, e, scale * dk_acc[i][j]);  // this block is the only writer of its keys
      store(dv, e, dv_acc[i][j]);
    }
  }
}

// Pass 3: dQ of one query tile.
template <class C>
__global__ void __launch_bounds__(kThreads)
    attention_dq_kernel(Array dq, ConstArray dout, ConstArray lse, ConstArray q, ConstArray k,
                        ConstArray v, const float* D, int64_t batch, int64_t seq, int64_t heads,
                        int64_t kv_heads, int hd, float scale) {
  constexpr int kHd = C::kHd, kBr = C::kBwdRows, kBc = C::kBwdKeys;
  constexpr int kLd = kHd + 1, kLs = kBc + 1;
  extern __shared__ float smem[];
  float* const q_s = smem;
  float* const do_s = q_s + kBr * kLd;
  float* const k_s = do_s + kBr * kLd;
  float* const v_s = k_s + kBc * kLd;
  float* const ds_s = v_s + kBc * kLd;
  float* const lse_s = ds_s + kBr * kLs;
  float* const d_s = lse_s + kBr;

  const int64_t slots = batch * heads;
  const int64_t slot = blockIdx.x % slots;
  const int64_t q0 = (ceil_div(seq, kBr) - 1 - blockIdx.x / slots) * kBr;
  const int64_t b = slot / heads, h = slot % heads, g = h / (heads / kv_heads);
  const int64_t q_stride = heads * hd, q_head = (b * seq * heads + h) * hd;
  const int64_t kv_stride = kv_heads * hd, kv_head = (b * seq * kv_heads + g) * hd;
  const int64_t stats = (b * heads + h) * seq;
  const int warp = threadIdx.x / kWarp, lane = threadIdx.x % kWarp;
  const int tr = threadIdx.x / kGrid, tc = threadIdx.x % kGrid;

  load_tile<kBr, kHd>(q_s, q, q_head, q_stride, q0, seq, hd);
  load_tile<kBr, kHd>(do_s, dout, q_head, q_stride, q0, seq, hd);
  for (int r = threadIdx.x; r < kBr; r += kThreads) {
    const bool real = q0 + r < seq;
    lse_s[r] = real ? load(lse, stats + q0 + r) : 0.0f;
    d_s[r] = real ? D[stats + q0 + r] : 0.0f;
  }
  float acc[kBr / kWarps][kHd / kWarp] = {};
  const int64_t key_end = seq < q0 + kBr ? seq : q0 + kBr;
  for (int64_t k0 = 0; k0 < key_end; k0 += kBc) {
    __syncthreads();  // the previous tile's readers of k_s, v_s, ds_s are done
    load_tile<kBc, kHd>(k_s, k, kv_head, kv_stride, k0, seq, hd);
    load_tile<kBc, kHd>(v_s, v, kv_head, kv_stride, k0, seq, hd);
    __syncthreads();
    {
      float s[kBr / kGrid][kBc / kGrid] = {}, dp[kBr / kGrid][kBc / kGrid] = {};
      tile_dot<kBr, kBc, kHd>(s, q_s, k_s, hd);
      tile_dot<kBr, kBc, kHd>(dp, do_s, v_s, hd);
#pragma unroll
      for (int i = 0; i < kBr / kGrid; ++i)
#pragma unroll
        for (int j = 0; j < kBc / kGrid; ++j) {
          const int r = tr + kGrid * i, c = tc + kGrid * j;
          const bool visible = k0 + c <= q0 + r && q0 + r < seq;
          const float p = visible ? expf(s[i][j] * scale - lse_s[r]) : 0.0f;
          ds_s[r * kLs + c] = p * (dp[i][j] - d_s[r]);
        }
    }
    __syncthreads();
    tile_accumulate<kBr, kBc, kHd>(acc, ds_s, kLs, 1, k_s);
  }
  // This block alone owns these rows of dq.
#pragma unroll
  for (int i = 0; i < kBr / kWarps; ++i) {
    const int64_t row = q0 + warp + kWarps * i;
    if (row >= seq) continue;
#pragma unroll
    for (int j = 0; j < kHd / kWarp; ++j) {
      const int d = lane + kWarp * j;
      if (d >= hd) continue;
      const int64_t e = q_head + row * q_stride + d;
      store(dq, e, scale * acc[i][j]);  // this block is the only writer of its queries
    }
  }
}

template <class C>
void forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k, ConstArray v,
             int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int hd, float scale) {
  constexpr size_t bytes = forward_floats<C>() * sizeof(float);
  const auto kernel = attention_forward_kernel<C>;
  allow_shared(kernel, bytes);
  const int64_t blocks = ceil_div(seq, C::kFwdRows) * batch * heads;
  kernel<<<unsigned(blocks), kThreads, bytes, stream>>>(out, lse, q, k, v, batch, seq, heads,
                                                        kv_heads, hd, scale);
}

template <class C>
void backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout, ConstArray lse,
              ConstArray q, ConstArray k, ConstArray v, const float* D, int64_t batch, int64_t seq,
              int64_t heads, int64_t kv_heads, int hd, float scale) {
  constexpr size_t dkdv_bytes = dkdv_floats<C>() * sizeof(float);
  const auto dkdv = attention_dkdv_kernel<C>;
  allow_shared(dkdv, dkdv_bytes);
  const int64_t dkdv_blocks = ceil_div(seq, C::kBwdKeys) * batch * kv_heads;
  dkdv<<<unsigned(dkdv_blocks), kThreads, dkdv_bytes, stream>>>(
      dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads, hd, scale);

  constexpr size_t dq_bytes = dq_floats<C>() * sizeof(float);
  const auto dq_kernel = attention_dq_kernel<C>;
  allow_shared(dq_kernel, dq_bytes);
  const int64_t dq_blocks = ceil_div(seq, C::kBwdRows) * batch * heads;
  dq_kernel<<<unsigned(dq_blocks), kThreads, dq_bytes, stream>>>(dq, dout, lse, q, k, v, D, batch,
                                                                 seq, heads, kv_heads, hd, scale);
}

}  // namespace

void simt_attention_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k,
                            ConstArray v, int64_t batch, int64_t seq, int64_t heads,
                            int64_t kv_heads, int hd, float scale) {
  if (hd <= 32)
    forward<Config<32>>(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, hd, scale);
  else if (hd <= 64)
    forward<Config<64>>(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, hd, scale);
  else if (hd <= 128)
    forward<Config<128>>(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, hd, scale);
  else
    forward<Config<256>>(stream, out, lse, q, k, v, batch, seq, heads, kv_heads, hd, scale);
}

void simt_attention_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout,
                             ConstArray lse, ConstArray q, ConstArray k, ConstArray v,
                             const float* D, int64_t batch, int64_t seq, int64_t heads,
                             int64_t kv_heads, int hd, float scale) {
  if (hd <= 32)
    backward<Config<32>>(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads, hd,
                         scale);
  else if (hd <= 64)
    backward<Config<64>>(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads, hd,
                         scale);
  else if (hd <= 128)
    backward<Config<128>>(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads,
                          hd, scale);
  else
    backward<Config<256>>(stream, dq, dk, dv, dout, lse, q, k, v, D, batch, seq, heads, kv_heads,
                          hd, scale);
}

void attention_row_terms(cudaStream_t stream, float* D, ConstArray dout, ConstArray out,
                         int64_t rows, int64_t seq, int64_t heads, int hd) {
  attention_row_dot_kernel<<<grid_for(rows, kWarps), kThreads, 0, stream>>>(D, dout, out, rows, seq,
                                                                            heads, hd);
}

}  // namespace bottle::cuda
