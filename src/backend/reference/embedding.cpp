// Embedding lookups and their gradients, for the whole table and for a vocabulary shard
// holding rows [first, first + rows).
#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

void ReferenceBackend::do_embedding_forward(Tensor out, Tensor tokens, Tensor table) {
  const char* k = "embedding_forward";
  need_f32(k, {out, table});
  need_dtype(k, tokens, DType::i32);
  const int64_t n = tokens.numel(), vocab = table.rows(), c = table.cols();
  need_numel(k, out, n * c, "out");
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens.i32()[t];
    BOTTLE_CHECK(id >= 0 && id < vocab, "reference backend: {}: token {} out of range [0, {})", k,
                 id, vocab);
    for (int64_t j = 0; j < c; ++j) out.f32()[t * c + j] = table.f32()[id * c + j];
  }
}

void ReferenceBackend::do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  const char* k = "embedding_backward";
  need_f32(k, {dtable, dout});
  need_dtype(k, tokens, DType::i32);
  const int64_t n = tokens.numel(), vocab = dtable.rows(), c = dtable.cols();
  need_numel(k, dout, n * c, "dout");
  for (int64_t t = 0; t < n; ++t) {
    const int32_t id = tokens.i32()[t];
    BOTTLE_CHECK(id >= 0 && id < vocab, "reference backend: {}: token {} out of range [0, {})", k,
                 id, vocab);
    for (int64_t j = 0; j < c; ++j) dtable.f32()[id * c + j] += dout.f32()[t * c + j];
  }
}

void ReferenceBackend::do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table,
                                                  int64_t first) {
  const char* k = "embedding_shard_forward";
  need_f32(k, {out, table});
  need_dtype(k, tokens, DType::i32);
  const int64_t n = tokens.numel(), rows = table.rows(), c = table.cols();
  need_numel(k, out, n * c, "out");
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = int64_t(tokens.i32()[t]) - first;
    const bool here = row >= 0 && row < rows;
    for (int64_t j = 0; j < c; ++j) out.f32()[t * c + j] = here ? table.f32()[row * c + j] : 0.0f;
  }
}

void ReferenceBackend::do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                                   int64_t first) {
  const char* k = "embedding_shard_backward";
  need_f32(k, {dtable, dout});
  need_dtype(k, tokens, DType::i32);
  const int64_t n = tokens.numel(), rows = dtable.rows(), c = dtable.cols();
  need_numel(k, dout, n * c, "dout");
  for (int64_t t = 0; t < n; ++t) {
    const int64_t row = int64_t(tokens.i32()[t]) - first;
    if (row < 0 || row >= rows) continue;
    for (int64_t j = 0; j < c; ++j) dtable.f32()[row * c + j] += dout.f32()[t * c + j];
  }
}

}  // namespace bottle
