// Embedding lookups and their gradients, whole-vocabulary and vocabulary-sharded (§4). Rows
// move between tables and activations of either dtype; a row copied between two bf16 tensors
// goes through fp32 like any other (widened and rounded: the same bits).
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {
namespace {

// dst row = src row, c elements, converting between their dtypes.
void copy_row(const Tensor& dst, int64_t dst_offset, const Tensor& src, int64_t src_offset,
              int64_t c, float* slab) {
  if (dst.dtype == DType::f32 && src.dtype == DType::f32) {
    std::memcpy(dst.f32() + dst_offset, src.f32() + src_offset, c * sizeof(float));
    return;
  }
  Window s(src, Access::read, slab);
  const float* from = s.at(src_offset, c);
  if (dst.dtype == DType::bf16)
    narrow_bf16(dst.bf16() + dst_offset, from, c);
  else
    std::memcpy(dst.f32() + dst_offset, from, c * sizeof(float));
}

void zero_row(const Tensor& dst, int64_t offset, int64_t c) {
  std::memset(static_cast<char*>(dst.data) + offset * int64_t(dtype_size(dst.dtype)), 0,
              size_t(c) * dtype_size(dst.dtype));
}

// dtable[first + row] += dout[i] for every token whose row falls inside the table, parallel
// over columns (rows may repeat, columns never collide). A bf16 table gradient, which no
// training step has (parameter gradients are fp32), is summed whole in fp32 and rounded
// once, as the fp32 kernel on the widened table does.
void scatter_add(Tensor dtable, const Tensor& tokens, const Tensor& dout, int64_t first,
                 Workspace& table_ws, Workspace& slab_ws) {
  const int64_t n = tokens.numel(), c = dtable.cols(), rows = dtable.rows();
  const int32_t* tok = tokens.i32();
  float* table = dtable.f32();
  if (dtable.dtype == DType::bf16) {
    table = table_ws.get(size_t(dtable.numel()));  // [rows, c]
    widen_bf16_parallel(table, dtable.bf16(), dtable.numel());
  }
  const Slabs slabs(slab_ws, CpuBackend::kTableSlabs, c, dout.dtype == DType::bf16);
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t c0 = c * t / nt, c1 = c * (t + 1) / nt;
    Window gw(dout, Access::read, slabs.get(0));
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = int64_t(tok[i]) - first;
      if (row < 0 || row >= rows) continue;
      float* dst = table + row * c + c0;
      // This thread's columns of the token's gradient row (widened: only these).
      const float* src = gw.at(i * c + c0, c1 - c0);
      for (int64_t j = 0; j < c1 - c0; ++j) dst[j] += src[j];
    }
  }
  if (dtable.dtype == DType::bf16) narrow_bf16_parallel(dtable.bf16(), table, dtable.numel());
}

}  // namespace

void CpuBackend::do_embedding_forward(Tensor out, Tensor tokens, Tensor table) {
  const int64_t n = tokens.numel(), c = table.cols(), v = table.rows();
  const int32_t* tok = tokens.i32();
  for (int64_t i = 0; i < n; ++i)
    BOTTLE_CHECK(tok[i] >= 0 && tok[i] < v,
                 "token id {} at position {} is outside the vocabulary [0, {})", tok[i], i, v);
  const Slabs slabs(slab_ws_, kTableSlabs, c, any_bf16({out, table}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) copy_row(out, i * c, table, int64_t(tok[i]) * c, c, slabs.get(0));
}

void CpuBackend::do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  scatter_add(dtable, tokens, dout, 0, gemm_ws_, slab_ws_);
}

void CpuBackend::do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table,
                                            int64_t first) {
  const int64_t n = tokens.numel(), c = table.cols(), rows = table.rows();
  const int32_t* tok = tokens.i32();
  const Slabs slabs(slab_ws_, kTableSlabs, c, any_bf16({out, table}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = int64_t(tok[i]) - first;
    if (row >= 0 && row < rows)
      copy_row(out, i * c, table, row * c, c, slabs.get(0));
    else
      zero_row(out, i * c, c);
  }
}

void CpuBackend::do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                             int64_t first) {
  scatter_add(dtable, tokens, dout, first, gemm_ws_, slab_ws_);
}

}  // namespace bottle::cpu
