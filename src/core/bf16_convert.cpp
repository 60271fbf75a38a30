#include "core/bf16_convert.h"

#include "core/bf16.h"

namespace bottle {

void widen_bf16(float* dst, const uint16_t* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void narrow_bf16(uint16_t* dst, const float* src, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_from_float(src[i]);
}

void widen_bf16_parallel(float* dst, const uint16_t* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_float(src[i]);
}

void narrow_bf16_parallel(uint16_t* dst, const float* src, int64_t n) {
#pragma omp parallel for simd schedule(static)
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_from_float(src[i]);
}

StridedMatrix strided_matrix(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                             int64_t batch, int64_t stride) {
  return {const_cast<void*>(data), dtype, rows, cols, ld, stride == 0 ? 1 : batch, stride};
}

void widen_matrix(float* dst, const StridedMatrix& m) {
  if (m.contiguous())
    return widen_bf16_parallel(dst, static_cast<const uint16_t*>(m.data), m.elements());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m.batch * m.rows; ++r) widen_bf16(dst + r * m.cols, m.row(r), m.cols);
}

void narrow_matrix(const StridedMatrix& m, const float* src) {
  if (m.contiguous())
    return narrow_bf16_parallel(static_cast<uint16_t*>(m.data), src, m.elements());
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < m.batch * m.rows; ++r) narrow_bf16(m.row(r), src + r * m.cols, m.cols);
}

}  // namespace bottle
