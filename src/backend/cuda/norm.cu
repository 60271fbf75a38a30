// RMSNorm and LayerNorm, forward and backward. Row statistics come from one block per row;
// the parameter gradients (dweight, dbias) from a second kernel in which each block owns a
// tile of columns and a chunk of rows, summed in an order fixed by the shape (and the device's
// size), then the chunks' sums added up in order: deterministic without atomics.
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kMaxRowThreads = 256;
// The parameter-gradient kernel's block: kTileCols adjacent columns (one warp reads them
// coalesced) by kRowGroups warps that take every kRowGroups-th row.
constexpr int kTileCols = kWarp;
constexpr int kRowGroups = 32;
constexpr int kParamThreads = kTileCols * kRowGroups;

// An output read back to accumulate into it. kernels.h's Array-to-ConstArray conversion is a
// host function, so the device code copies the fields.
__device__ __forceinline__ float load_out(Array a, int64_t i) {
  ConstArray c;
  c.data = a.data;
  c.dtype = a.dtype;
  return load(c, i);
}

// A row kernel's block: one thread per column (per pack of kPack columns when the row is
// packed) up to kMaxRowThreads, so a narrow row leaves no warp idle. Depends on the shape
// alone, hence so does the order of the block's sums.
int row_threads(int64_t lanes) {
  const int64_t rounded = (lanes + kWarp - 1) / kWarp * kWarp;
  return int(rounded < kWarp ? kWarp : rounded > kMaxRowThreads ? kMaxRowThreads : rounded);
}

// The row kernels below are written over kW adjacent columns per thread and step: kPack (one
// 128-bit access per array) when every row is whole packs of aligned arrays, else 1. Thread t
// takes columns [kW t, kW t + kW), then kW·blockDim further on, and so on.
#define BOTTLE_FOR_ROW_LANES(j, cols) \
  for (int64_t j = int64_t(threadIdx.x) * kW; j < (cols); j += int64_t(blockDim.x) * kW)

template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_forward_kernel(Array out, Array rstd, Array sumsq, ConstArray x, ConstArray weight,
                           int64_t cols, float eps) {
  __shared__ float shared[kWarp];
  const int64_t r = blockIdx.x, row = r * cols;
  float ss = 0.0f;
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float v[kW];
    load_lanes<kW>(x, row + j, v);
#pragma unroll
    for (int e = 0; e < kW; ++e) ss += v[e] * v[e];
  }
  ss = block_sum(ss, shared);
  const float rs = kmath::rstd_from_sum_squares(ss, float(cols), eps);
  if (threadIdx.x == 0) {
    if (rstd.data != nullptr) store(rstd, r, rs);
    if (sumsq.data != nullptr) store(sumsq, r, ss);
  }
  // Every thread has read its x before the block sum's barrier, so out may alias x.
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float v[kW], w[kW];
    load_lanes<kW>(x, row + j, v);
    load_lanes<kW>(weight, j, w);
#pragma unroll
    for (int e = 0; e < kW; ++e) v[e] = v[e] * rs * w[e];
    store_lanes<kW>(out, row + j, v);
  }
}

// One block per row: the sum is formed in fp32, stored once and its squares summed; the second
// walk forms it again from x and residual (sum is rounded in bf16, and aliases neither).
template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    residual_rmsnorm_forward_kernel(Array sum, Array out, Array rstd, ConstArray x,
                                    ConstArray residual, ConstArray weight, int64_t cols,
                                    float eps) {
  __shared__ float shared[kWarp];
  const int64_t r = blockIdx.x, row = r * cols;
  float ss = 0.0f;
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float a[kW], b[kW];
    load_lanes<kW>(x, row + j, a);
    load_lanes<kW>(residual, row + j, b);
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      a[e] += b[e];
      ss += a[e] * a[e];
    }
    store_lanes<kW>(sum, row + j, a);
  }
  ss = block_sum(ss, shared);
  const float rs = kmath::rstd_from_sum_squares(ss, float(cols), eps);
  if (threadIdx.x == 0) store(rstd, r, rs);
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float a[kW], b[kW], w[kW];
    load_lanes<kW>(x, row + j, a);
    load_lanes<kW>(residual, row + j, b);
    load_lanes<kW>(weight, j, w);
#pragma unroll
    for (int e = 0; e < kW; ++e) a[e] = (a[e] + b[e]) * rs * w[e];
    store_lanes<kW>(out, row + j, a);
  }
}

// What a backward row walk reads at columns [j, j + kW) of row `row`: dout, weight and x.
template <int kW>
struct BackwardLanes {
  float g[kW], w[kW], v[kW];
  __device__ __forceinline__ BackwardLanes(ConstArray dout, ConstArray weight, ConstArray x,
                                           int64_t row, int64_t j) {
    load_lanes<kW>(dout, row + j, g);
    load_lanes<kW>(weight, j, w);
    load_lanes<kW>(x, row + j, v);
  }
};

template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    rmsnorm_backward_dx_kernel(Array dx, ConstArray dout, ConstArray x, ConstArray weight,
                               ConstArray rstd, ConstArray dot, int64_t cols, float d) {
  __shared__ float shared[kWarp];
  const int64_t r = blockIdx.x, row = r * cols;
  const float rs = load(rstd, r);
  float row_dot;
  if (dot.data != nullptr) {
    row_dot = load(dot, r);
  } else {
    row_dot = 0.0f;
    BOTTLE_FOR_ROW_LANES(j, cols) {
      const BackwardLanes<kW> l(dout, weight, x, row, j);
#pragma unroll
      for (int e = 0; e < kW; ++e) row_dot += l.g[e] * l.w[e] * l.v[e];
    }
    row_dot = block_sum(row_dot, shared);
  }
  const float factor = kmath::rmsnorm_dx_row_factor(rs, row_dot, d);
  BOTTLE_FOR_ROW_LANES(j, cols) {
    const BackwardLanes<kW> l(dout, weight, x, row, j);
    float acc[kW];
    load_lanes<kW>(dx, row + j, acc);
#pragma unroll
    for (int e = 0; e < kW; ++e)
      acc[e] += kmath::rmsnorm_dx_from_factor(l.g[e], l.v[e], l.w[e], rs, factor);
    store_lanes<kW>(dx, row + j, acc);
  }
}

template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    layernorm_forward_kernel(Array out, Array mean, Array rstd, ConstArray x, ConstArray weight,
                             ConstArray bias, int64_t cols, float eps) {
  __shared__ float shared[kWarp];
  const int64_t r = blockIdx.x, row = r * cols;
  float s = 0.0f;
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float v[kW];
    load_lanes<kW>(x, row + j, v);
#pragma unroll
    for (int e = 0; e < kW; ++e) s += v[e];
  }
  const float mu = block_sum(s, shared) / float(cols);
  // The variance from deviations, not E[x²] - mean², which cancels when |mean| >> std.
  float var = 0.0f;
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float v[kW];
    load_lanes<kW>(x, row + j, v);
#pragma unroll
    for (int e = 0; e < kW; ++e) var += (v[e] - mu) * (v[e] - mu);
  }
  const float rs = kmath::rstd_from_sum_squares(block_sum(var, shared), float(cols), eps);
  if (threadIdx.x == 0) {
    store(mean, r, mu);
    store(rstd, r, rs);
  }
  BOTTLE_FOR_ROW_LANES(j, cols) {
    float v[kW], w[kW], b[kW];
    load_lanes<kW>(x, row + j, v);
    load_lanes<kW>(weight, j, w);
    load_lanes<kW>(bias, j, b);
#pragma unroll
    for (int e = 0; e < kW; ++e) v[e] = (v[e] - mu) * rs * w[e] + b[e];
    store_lanes<kW>(out, row + j, v);
  }
}

template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    layernorm_backward_dx_kernel(Array dx, ConstArray dout, ConstArray x, ConstArray weight,
                                 ConstArray mean, ConstArray rstd, int64_t cols) {
  __shared__ float shared[kWarp];
  const int64_t r = blockIdx.x, row = r * cols;
  const float mu = load(mean, r), rs = load(rstd, r);
  float sum_g = 0.0f, sum_gx = 0.0f;
  BOTTLE_FOR_ROW_LANES(j, cols) {
    const BackwardLanes<kW> l(dout, weight, x, row, j);
#pragma unroll
    for (int e = 0; e < kW; ++e) {
      const float gw = l.g[e] * l.w[e];
      sum_g += gw;
      sum_gx += gw * ((l.v[e] - mu) * rs);
    }
  }
  const float mean_g = block_sum(sum_g, shared) / float(cols);
  const float mean_gx = block_sum(sum_gx, shared) / float(cols);
  BOTTLE_FOR_ROW_LANES(j, cols) {
    const BackwardLanes<kW> l(dout, weight, x, row, j);
    float out[kW];
#pragma unroll
    for (int e = 0; e < kW; ++e)
      out[e] = kmath::layernorm_dx(l.g[e] * l.w[e], (l.v[e] - mu) * rs, rs, mean_g, mean_gx);
    store_lanes<kW>(dx, row + j, out);  // its only producer
  }
}

#undef BOTTLE_FOR_ROW_LANES

// Launches a row kernel, one block per row, packed when every row is whole packs and every
// array is aligned.
template <typename Launch>
void launch_rows(cudaStream_t stream, int64_t rows, int64_t cols,
                 std::initializer_list<const void*> arrays, const Launch& launch) {
  if (rows == 0) return;
  if (cols % kPack == 0 && packable(arrays))
    launch(std::integral_constant<int, kPack>{}, dim3(unsigned(rows)),
           dim3(row_threads(cols / kPack)), stream);
  else
    launch(std::integral_constant<int, 1>{}, dim3(unsigned(rows)), dim3(row_threads(cols)), stream);
}

// The per-element terms of the parameter gradients, summed over the rows by
// param_grad_kernel: add(acc, r, i) adds element i's (in row r) term of output k to acc[k].
struct RmsnormParamTerms {
  static constexpr int kCount = 1;
  ConstArray dout, x, rstd;
  __device__ __forceinline__ void add(float* acc, int64_t r, int64_t i) const {
    acc[0] += load(dout, i) * load(x, i) * load(rstd, r);
  }
};
struct LayernormParamTerms {
  static constexpr int kCount = 2;  // dweight, dbias
  ConstArray dout, x, mean, rstd;
  __device__ __forceinline__ void add(float* acc, int64_t r, int64_t i) const {
    const float g = load(dout, i);
    acc[0] += g * ((load(x, i) - load(mean, r)) * load(rstd, r));
    acc[1] += g;
  }
};

// The parameter gradients' reduction over the rows, for the block's tile of columns and its
// chunk of rows (blockIdx.y of gridDim.y, so that a narrow norm still fills the device: one
// tile per 32 columns alone gave 64 blocks at d = 2048). Thread (tx, ty) sums rows ty,
// ty + kRowGroups, ... of the chunk in order; the row groups' sums are then added in the order
// of ty. With one chunk the block adds its sum to out_k[j]; with several it writes it to
// partials [kCount][chunks][cols], which param_grad_finish_kernel adds up in chunk order. Every
// order depends on the shape and the device's size alone.
template <typename Terms>
__global__ void __launch_bounds__(kParamThreads)
    param_grad_kernel(Array out0, Array out1, float* partials, Terms terms, int64_t rows,
                      int64_t cols, int64_t chunk_rows) {
  __shared__ float partial[Terms::kCount][kRowGroups][kTileCols];
  const int64_t j = int64_t(blockIdx.x) * kTileCols + threadIdx.x;
  const int64_t begin = int64_t(blockIdx.y) * chunk_rows;
  const int64_t end = begin + chunk_rows < rows ? begin + chunk_rows : rows;
  float acc[Terms::kCount] = {};
  if (j < cols) {
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kRowGroups) terms.add(acc, r, r * cols + j);
  }
#pragma unroll
  for (int k = 0; k < Terms::kCount; ++k) partial[k][threadIdx.y][threadIdx.x] = acc[k];
  __syncthreads();
  if (threadIdx.y != 0 || j >= cols) return;
#pragma unroll
  for (int k = 0; k < Terms::kCount; ++k) {
    float s = 0.0f;
    for (int g = 0; g < kRowGroups; ++g) s += partial[k][g][threadIdx.x];
    if (gridDim.y > 1) {
      partials[(int64_t(k) * gridDim.y + blockIdx.y) * cols + j] = s;
      continue;
    }
    const Array out = k == 0 ? out0 : out1;
    store(out, j, load_out(out, j) + s);
  }
}

// out_k[j] += Σ_c partials[k][c][j], c in order.
__global__ void param_grad_finish_kernel(Array out0, Array out1, const float* partials, int count,
                                         int64_t chunks, int64_t cols) {
  for (int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; j < cols;
       j += int64_t(gridDim.x) * blockDim.x) {
    for (int k = 0; k < count; ++k) {
      float s = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) s += partials[(k * chunks + c) * cols + j];
      const Array out = k == 0 ? out0 : out1;
      store(out, j, load_out(out, j) + s);
    }
  }
}

// Row chunks of the parameter-gradient reduction: as many as make the column tiles one wave of
// the device, but no more than one per kMinChunkRows rows (so a chunk has at least half that).
constexpr int64_t kMinChunkRows = int64_t(kRowGroups) * 8;
int64_t param_grad_chunks(int64_t rows, int64_t cols) {
  const int64_t tiles = (cols + kTileCols - 1) / kTileCols;
  const int64_t wave = resident_threads() / kParamThreads;
  int64_t chunks = tiles >= wave ? 1 : (wave + tiles - 1) / tiles;
  const int64_t most = (rows + kMinChunkRows - 1) / kMinChunkRows;
  if (chunks > most) chunks = most;
  if (chunks > 65535) chunks = 65535;
  return chunks < 1 ? 1 : chunks;
}

template <typename Terms>
void launch_param_grad(cudaStream_t stream, Array out0, Array out1, float* partials,
                       const Terms& terms, int64_t rows, int64_t cols) {
  if (cols == 0) return;
  const unsigned tiles = unsigned((cols + kTileCols - 1) / kTileCols);
  const int64_t chunks = param_grad_chunks(rows, cols);
  const int64_t chunk_rows = (rows + chunks - 1) / chunks;
  param_grad_kernel<Terms>
      <<<dim3(tiles, unsigned(chunks)), dim3(kTileCols, kRowGroups), 0, stream>>>(
          out0, out1, partials, terms, rows, cols, chunk_rows);
  if (chunks == 1) return;
  constexpr int kFinishThreads = 256;
  param_grad_finish_kernel<<<grid_for(cols, kFinishThreads), kFinishThreads, 0, stream>>>(
      out0, out1, partials, Terms::kCount, chunks, cols);
}

}  // namespace

void rmsnorm_forward(cudaStream_t stream, Array out, Array rstd, Array sumsq, ConstArray x,
                     ConstArray weight, int64_t rows, int64_t cols, float eps) {
  launch_rows(stream, rows, cols, {out.data, x.data, weight.data},
              [&](auto w, dim3 grid, dim3 block, cudaStream_t s) {
                rmsnorm_forward_kernel<decltype(w)::value>
                    <<<grid, block, 0, s>>>(out, rstd, sumsq, x, weight, cols, eps);
              });
}

void residual_rmsnorm_forward(cudaStream_t stream, Array sum, Array out, Array rstd, ConstArray x,
                              ConstArray residual, ConstArray weight, int64_t rows, int64_t cols,
                              float eps) {
  launch_rows(stream, rows, cols, {sum.data, out.data, x.data, residual.data, weight.data},
              [&](auto w, dim3 grid, dim3 block, cudaStream_t s) {
                residual_rmsnorm_forward_kernel<decltype(w)::value>
                    <<<grid, block, 0, s>>>(sum, out, rstd, x, residual, weight, cols, eps);
              });
}

size_t norm_backward_scratch_bytes(int64_t rows, int64_t cols) {
  const int64_t chunks = param_grad_chunks(rows, cols);
  return chunks == 1 ? 0 : size_t(2 * chunks * cols) * sizeof(float);  // LayerNorm's two outputs
}

void rmsnorm_backward(cudaStream_t stream, Array dx, Array dweight, ConstArray dout, ConstArray x,
                      ConstArray weight, ConstArray rstd, ConstArray dot, int64_t rows,
                      int64_t cols, int64_t d, float* scratch) {
  if (rows == 0) return;
  // Without a given dot the row is the whole normalised vector, whatever d says.
  const float width = float(dot.data == nullptr ? cols : d);
  launch_rows(stream, rows, cols, {dx.data, dout.data, x.data, weight.data},
              [&](auto w, dim3 grid, dim3 block, cudaStream_t s) {
                rmsnorm_backward_dx_kernel<decltype(w)::value>
                    <<<grid, block, 0, s>>>(dx, dout, x, weight, rstd, dot, cols, width);
              });
  launch_param_grad(stream, dweight, Array{}, scratch, RmsnormParamTerms{dout, x, rstd}, rows,
                    cols);
}

void layernorm_forward(cudaStream_t stream, Array out, Array mean, Array rstd, ConstArray x,
                       ConstArray weight, ConstArray bias, int64_t rows, int64_t cols, float eps) {
  launch_rows(stream, rows, cols, {out.data, x.data, weight.data, bias.data},
              [&](auto w, dim3 grid, dim3 block, cudaStream_t s) {
                layernorm_forward_kernel<decltype(w)::value>
                    <<<grid, block, 0, s>>>(out, mean, rstd, x, weight, bias, cols, eps);
              });
}

void layernorm_backward(cudaStream_t stream, Array dx, Array dweight, Array dbias, ConstArray dout,
                        ConstArray x, ConstArray weight, ConstArray mean, ConstArray rstd,
                        int64_t rows, int64_t cols, float* scratch) {
  if (rows == 0) return;
  launch_rows(stream, rows, cols, {dx.data, dout.data, x.data, weight.data},
              [&](auto w, dim3 grid, dim3 block, cudaStream_t s) {
                layernorm_backward_dx_kernel<decltype(w)::value>
                    <<<grid, block, 0, s>>>(dx, dout, x, weight, mean, rstd, cols);
              });
  launch_param_grad(stream, dweight, dbias, scratch, LayernormParamTerms{dout, x, mean, rstd}, rows,
                    cols);
}

}  // namespace bottle::cuda
