// Strided-batched GEMM as three plain loops, each dot product summed in double.
#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

void ReferenceBackend::do_gemm(const GemmArgs& g) {
  if (g.any_bf16()) fail("reference backend: {} does not support dtype {}", "gemm", "bf16");
  BOTTLE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0,
               "reference backend: gemm: negative size m={} n={} k={} batch={}", g.m, g.n, g.k,
               g.batch);
  BOTTLE_CHECK(g.lda >= (g.trans_a ? g.m : g.k) && g.ldb >= (g.trans_b ? g.k : g.n) && g.ldc >= g.n,
               "reference backend: gemm: leading dimension too small (lda={} ldb={} ldc={})", g.lda,
               g.ldb, g.ldc);
  const float* a = static_cast<const float*>(g.a);
  const float* b = static_cast<const float*>(g.b);
  float* c = static_cast<float*>(g.c);
  const float* c_in = static_cast<const float*>(g.c_read());
  for (int64_t i = 0; i < g.batch; ++i) {
    const float* ai = a + i * g.stride_a;
    const float* bi = b + i * g.stride_b;
    float* ci = c + i * g.stride_c;
    const float* ci_in = c_in + i * g.stride_c;
    for (int64_t r = 0; r < g.m; ++r) {
      for (int64_t col = 0; col < g.n; ++col) {
        double sum = 0.0;
        for (int64_t p = 0; p < g.k; ++p) {
          const double av = g.trans_a ? ai[p * g.lda + r] : ai[r * g.lda + p];
          const double bv = g.trans_b ? bi[col * g.ldb + p] : bi[p * g.ldb + col];
          sum += av * bv;
        }
        const int64_t at = r * g.ldc + col;
        double value = double(g.alpha) * sum;
        if (g.beta != 0.0f) value += double(g.beta) * double(ci_in[at]);  // beta == 0: ignore C
        ci[at] = float(value);
      }
    }
  }
}

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace bottle
