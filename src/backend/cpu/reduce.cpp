// Whole-tensor reductions to a host double: the sum of squares (gradient norms) and the sum.
// bf16 elements are read as the fp32 values they are; the sums are the same as over the
// widened tensor, since each element is converted exactly and added in the same order.
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {
namespace {

inline float value(const float* p, int64_t i) { return p[i]; }
inline float value(const uint16_t* p, int64_t i) { return bf16_to_float(p[i]); }

// Chunks of a fixed size, each summed in order, and the chunks' sums added in order: the same
// bits whatever the thread count (a gradient norm decides clipping).
template <typename T>
double sum_squares_of(const T* s, int64_t n) {
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(size_t(chunks), 0.0);  // [chunks]
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double sum = 0.0;
    for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
      const float x = value(s, i);
      sum += double(x) * x;
    }
    partial[size_t(c)] = sum;
  }
  double total = 0.0;
  for (const double p : partial) total += p;
  return total;
}

template <typename T>
double sum_of(const T* s, int64_t n) {
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) total += value(s, i);
  return total;
}

}  // namespace

double CpuBackend::do_sum_squares(Tensor x) {
  return x.dtype == DType::bf16 ? sum_squares_of(x.bf16(), x.numel())
                                : sum_squares_of(x.f32(), x.numel());
}

double CpuBackend::do_sum(Tensor x) {
  return x.dtype == DType::bf16 ? sum_of(x.bf16(), x.numel()) : sum_of(x.f32(), x.numel());
}

}  // namespace bottle::cpu
