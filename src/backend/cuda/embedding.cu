// Embedding lookup and its gradient, for a table holding vocabulary rows
// [first, first + table_rows) (the whole vocabulary when first = 0 and table_rows = V).
#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per kW adjacent output elements of a row (kPack with 128-bit accesses when rows
// are whole packs of aligned arrays, else 1), in a grid-stride loop over n × cols / kW.
template <int kW>
__global__ void embedding_forward_kernel(Array out,              // [n, cols]
                                         const int32_t* tokens,  // [n]
                                         ConstArray table,       // [table_rows, cols]
                                         int64_t n, int64_t table_rows, int64_t cols,
                                         int64_t first) {
  const int64_t total = n * cols / kW, per_row = cols / kW;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / per_row, c = (e - i * per_row) * kW;
    const int64_t row = int64_t(tokens[i]) - first;
    float v[kW] = {};
    if (row >= 0 && row < table_rows) load_lanes<kW>(table, row * cols + c, v);
    store_lanes<kW>(out, i * cols + c, v);
  }
}

// Deterministic without atomics: every element dtable[row, c] is owned by one thread, which
// adds the dout[i, c] of the tokens i that hit `row` in increasing i, exactly the sequential
// order of the reference backend, so the result does not depend on the launch geometry.
//
// blockIdx.x picks a tile of kThreads · kW columns (thread = kW adjacent columns, one pack
// when rows are whole packs of aligned arrays, so dout and dtable accesses are coalesced);
// blockIdx.y picks the table rows with row % gridDim.y == blockIdx.y, which spreads the otherwise
// serial loop over the tokens across gridDim.y blocks. Every block reads all n token ids, a tile at
// a time through shared memory, and skips the ones it does not own.
template <int kW>
__global__ void embedding_backward_kernel(Array dtable,           // [table_rows, cols]
                                          ConstArray dtable_in,   // dtable, read
                                          const int32_t* tokens,  // [n]
                                          ConstArray dout,        // [n, cols]
                                          int64_t n, int64_t table_rows, int64_t cols,
                                          int64_t first) {
  // The table row of each token of the tile, or -1 when this block does not own it.
  __shared__ int64_t rows[kThreads];
  const int64_t c = (int64_t(blockIdx.x) * kThreads + threadIdx.x) * kW;
  const int64_t parts = gridDim.y, part = blockIdx.y;
  for (int64_t tile = 0; tile < n; tile += kThreads) {
    const int64_t count = n - tile < kThreads ? n - tile : kThreads;
    __syncthreads();  // the previous tile's rows are no longer read
    if (threadIdx.x < count) {
      const int64_t row = int64_t(tokens[tile + threadIdx.x]) - first;
      rows[threadIdx.x] = row >= 0 && row < table_rows && row % parts == part ? row : -1;
    }
    __syncthreads();
    if (c >= cols) continue;  // after the barriers: idle columns still load token ids
    for (int64_t k = 0; k < count; ++k) {
      const int64_t row = rows[k];
      if (row < 0) continue;
      const int64_t at = row * cols + c;
      float acc[kW], g[kW];
      load_lanes<kW>(dtable_in, at, acc);
      load_lanes<kW>(dout, (tile + k) * cols + c, g);
#pragma unroll
      for (int e = 0; e < kW; ++e) acc[e] += g[e];
      store_lanes<kW>(dtable, at, acc);
    }
  }
}

}  // namespace

void embedding_forward(cudaStream_t stream, Array out, const int32_t* tokens, int64_t n,
                       ConstArray table, int64_t table_rows, int64_t cols, int64_t first) {
  if (n <= 0 || cols <= 0) return;
  if (cols % kPack == 0 && packable({out.data, table.data})) {
    embedding_forward_kernel<kPack>
        <<<device_grid_for(n * cols / kPack, kThreads), kThreads, 0, stream>>>(
            out, tokens, table, n, table_rows, cols, first);
    return;
  }
  embedding_forward_kernel<1><<<device_grid_for(n * cols, kThreads), kThreads, 0, stream>>>(
      out, tokens, table, n, table_rows, cols, first);
}

void embedding_backward(cudaStream_t stream, Array dtable, const int32_t* tokens, int64_t n,
                        ConstArray dout, int64_t table_rows, int64_t cols, int64_t first) {
  if (n <= 0 || cols <= 0 || table_rows <= 0) return;
  const bool packed = cols % kPack == 0 && packable({dtable.data, dout.data});
  const int64_t tile_cols = int64_t(kThreads) * (packed ? kPack : 1);
  const int64_t column_tiles = (cols + tile_cols - 1) / tile_cols;
  // Row partitions: about 1024 blocks in all (several per SM on any current GPU), at most
  // one per table row and within gridDim.y's limit. Any count gives the same bits.
  int64_t parts = (1024 + column_tiles - 1) / column_tiles;
  if (parts > table_rows) parts = table_rows;
  if (parts > 65535) parts = 65535;
  const dim3 grid{unsigned(column_tiles), unsigned(parts)};
  if (packed)
    embedding_backward_kernel<kPack><<<grid, kThreads, 0, stream>>>(
        dtable, ConstArray(dtable), tokens, dout, n, table_rows, cols, first);
  else
    embedding_backward_kernel<1><<<grid, kThreads, 0, stream>>>(dtable, ConstArray(dtable), tokens,
                                                                dout, n, table_rows, cols, first);
}

}  // namespace bottle::cuda
