#pragma once
// Conversions between bf16 and fp32 arrays on the host: the one place the host backends (cpu,
// and the widening backend around reference) convert. Widening is exact (a bf16 is the top
// half of an fp32); narrowing rounds to nearest, ties to even, with kmath::bf16_from_float,
// which the compiler vectorises into integer adds, shifts and blends on AVX2 and AVX-512
// alike. AVX512-BF16's vcvtneps2bf16 is not used: it flushes fp32 subnormals (below 2^-126)
// to zero, so it would store other bits than the reference backend's rounding for the tiny
// gradients a run does meet, and the bf16 kernels would stop being exact against the oracle.
#include <cstdint>

#include "core/tensor.h"

namespace bottle {

// On the calling thread (a kernel's own loop calls these on its rows).
void widen_bf16(float* dst, const uint16_t* src, int64_t n);
void narrow_bf16(uint16_t* dst, const float* src, int64_t n);
// Split across the OpenMP threads, for whole tensors.
void widen_bf16_parallel(float* dst, const uint16_t* src, int64_t n);
void narrow_bf16_parallel(uint16_t* dst, const float* src, int64_t n);

// A GEMM operand in memory: `batch` matrices (one when the batch stride is 0) of `rows` rows
// of `cols` elements, row stride `ld`, batch stride `stride`. Its fp32 stand-in is compact
// (row stride cols, batch stride rows·cols): the gaps between rows and between a batch's
// matrices may be other tensors', which must be neither read nor written.
struct StridedMatrix {
  void* data = nullptr;
  DType dtype = DType::f32;
  int64_t rows = 0, cols = 0, ld = 0, batch = 1, stride = 0;
  int64_t elements() const { return batch * rows * cols; }
  // One run of elements (a whole tensor, a dense matrix): converted in parallel chunks.
  bool contiguous() const {
    return (rows == 1 || ld == cols) && (batch == 1 || stride == rows * cols);
  }
  uint16_t* row(int64_t r) const {  // r < batch·rows
    return static_cast<uint16_t*>(data) + (r / rows) * stride + (r % rows) * ld;
  }
};

StridedMatrix strided_matrix(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                             int64_t batch, int64_t stride);
// dst[batch·rows, cols] (compact) = the bf16 matrix m, widened; and back, rounded.
void widen_matrix(float* dst, const StridedMatrix& m);
void narrow_matrix(const StridedMatrix& m, const float* src);

}  // namespace bottle
