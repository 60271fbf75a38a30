// Embedding lookup and its gradient, for a table holding vocabulary rows
// [first, first + table_rows) (the whole vocabulary when first = 0 and table_rows = V).
#include "core/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// One thread per output element (i, c) in a grid-stride loop over n × cols.
__global__ void embedding_forward_kernel(Array out,              // [n, cols]
                                         const int32_t* tokens,  // [n]
                                         ConstArray table,       // [table_rows, cols]
                                         int64_t n, int64_t table_rows, int64_t cols,
                                         int64_t first) {
  const int64_t total = n * cols;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t i = e / cols, c = e - i * cols;
    const int64_t row = int64_t(tokens[i]) - first;
    const bool here = row >= 0 && row < table_rows;
    store(out, e, here ? load(table, row * cols + c) : 0.0f);
  }
}

// Deterministic without atomics: every element dtable[row, c] is owned by one thread, which
// adds the dout[i, c] of the tokens i that hit `row` in increasing i, exactly the sequential
// order of the reference backend, so the result does not depend on the launch geometry.
//
// blockIdx.x picks a tile of kThreads columns (thread = column, so dout and dtable accesses
// are coalesced); blockIdx.y picks the table rows with row % gridDim.y == blockIdx.y, which
// spreads the otherwise serial loop over the tokens across gridDim.y blocks. Every block reads
// all n token ids, a tile at a time through shared memory, and skips the ones it does not own.
__global__ void embedding_backward_kernel(Array dtable,           // [table_rows, cols]
                                          ConstArray dtable_in,   // dtable, read
                                          const int32_t* tokens,  // [n]
                                          ConstArray dout,        // [n, cols]
                                          int64_t n, int64_t table_rows, int64_t cols,
                                          int64_t first) {
  // The table row of each token of the tile, or -1 when this block does not own it.
  __shared__ int64_t rows[kThreads];
  const int64_t c = int64_t(blockIdx.x) * kThreads + threadIdx.x;
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
      store(dtable, at, load(dtable_in, at) + load(dout, (tile + k) * cols + c));
    }
  }
}

}  // namespace

void embedding_forward(cudaStream_t stream, Array out, const int32_t* tokens, int64_t n,
                       ConstArray table, int64_t table_rows, int64_t cols, int64_t first) {
  if (n <= 0 || cols <= 0) return;
  embedding_forward_kernel<<<grid_for(n * cols, kThreads), kThreads, 0, stream>>>(
      out, tokens, table, n, table_rows, cols, first);
}

void embedding_backward(cudaStream_t stream, Array dtable, const int32_t* tokens, int64_t n,
                        ConstArray dout, int64_t table_rows, int64_t cols, int64_t first) {
  if (n <= 0 || cols <= 0 || table_rows <= 0) return;
  const int64_t column_tiles = (cols + kThreads - 1) / kThreads;
  // Row partitions: about 1024 blocks in all (several per SM on any current GPU), at most
  // one per table row and within gridDim.y's limit. Any count gives the same bits.
  int64_t parts = (1024 + column_tiles - 1) / column_tiles;
  if (parts > table_rows) parts = table_rows;
  if (parts > 65535) parts = 65535;
  const dim3 grid{unsigned(column_tiles), unsigned(parts)};
  embedding_backward_kernel<<<grid, kThreads, 0, stream>>>(dtable, ConstArray(dtable), tokens, dout,
                                                           n, table_rows, cols, first);
}

}  // namespace bottle::cuda
