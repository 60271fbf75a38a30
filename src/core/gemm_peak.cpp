#include "core/gemm_peak.h"

#include <algorithm>
#include <chrono>

#include "core/arena.h"

namespace bottle {

double measure_gemm_peak_gflops(Backend& be) {
  Arena arena(MemoryTag::workspace);
  double best = 0.0;
  // Not 1536: its row stride makes oneDNN run at half speed here.
  for (int64_t n : {1024, 2048}) {
    Tensor a = arena.alloc({n, n}), b = arena.alloc({n, n}), c = arena.alloc({n, n});
    std::fill(a.f32(), a.f32() + a.numel(), 0.01f);
    std::fill(b.f32(), b.f32() + b.numel(), 0.02f);
    GemmArgs g;
    g.m = g.n = g.k = n;
    g.a = a.data, g.b = b.data, g.c = c.data;
    g.lda = g.ldb = g.ldc = n;
    be.gemm(g);  // creates the primitive
    for (int rep = 0; rep < 3; ++rep) {
      const auto t0 = std::chrono::steady_clock::now();
      be.gemm(g);
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      best = std::max(best, 2.0 * double(n) * double(n) * double(n) / (ms * 1e6));
    }
  }
  return best;
}

}  // namespace bottle
