#include "backend/gemm_peak.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/arena.h"

namespace bottle {

namespace {

// A GPU's peak: products large enough to fill it (n = 8192), timed in runs of 10 between
// synchronisations (each product alone would time its launch), on data of many values (a GPU
// multiplies constant data faster than real weights).
double measure_device_peak_gflops(Backend& be, DType dtype) {
  using Clock = std::chrono::steady_clock;
  constexpr int64_t n = 8192;
  constexpr int kRuns = 10, kRounds = 3;
  Arena arena(MemoryTag::workspace, be);
  Tensor a = arena.alloc({n, n}, dtype), b = arena.alloc({n, n}, dtype), c = arena.alloc({n, n});
  {
    std::vector<float> host(size_t(n * n));
    uint32_t x = 12345;
    for (float& v : host) {
      x = x * 1664525u + 1013904223u;
      v = float(int32_t(x >> 8) - (1 << 23)) * (1.0f / float(1 << 23));
    }
    be.from_host(c, host.data());
    be.copy(a, c);
    be.copy(b, c);
  }
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data, g.b = b.data, g.c = c.data;
  g.lda = g.ldb = g.ldc = n;
  g.dtypes_of(a, b, c);
  be.gemm(g);  // the algorithm's choice and the clocks' ramp stay out of the timing
  be.gemm(g);
  be.synchronize();
  const double flops = 2.0 * double(n) * double(n) * double(n) * kRuns;
  double best = 0.0;
  for (int round = 0; round < kRounds; ++round) {
    const auto t0 = Clock::now();
    for (int run = 0; run < kRuns; ++run) be.gemm(g);
    be.synchronize();
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    best = std::max(best, flops / (ms * 1e6));
  }
  return best;
}

}  // namespace

double measure_gemm_peak_gflops(Backend& be, DType dtype) {
  if (be.device() != Device::cpu) return measure_device_peak_gflops(be, dtype);
  using Clock = std::chrono::steady_clock;
  constexpr double kSecondsPerShape = 0.25;
  constexpr int kMaxRuns = 50;
  Arena arena(MemoryTag::workspace, be);
  double best = 0.0;
  // Not 1536: its row stride makes oneDNN run at half speed here.
  for (int64_t n : {1024, 2048}) {
    const double flops = 2.0 * double(n) * double(n) * double(n);
    // Every run starts the trainer: on a slow or busy machine the larger shape (8x the work)
    // would cost seconds and, where it matters at all, adds little to the smaller's peak.
    if (best > 0.0 && flops / (best * 1e9) > kSecondsPerShape / 2) break;
    Tensor a = arena.alloc({n, n}, dtype), b = arena.alloc({n, n}, dtype), c = arena.alloc({n, n});
    // Finite operands of one value (GEMM time does not depend on them), staged to the device
    // and converted there.
    Tensor staging = arena.alloc({n, n});
    const std::vector<float> a_host(size_t(a.numel()), 0.01f), b_host(size_t(b.numel()), 0.02f);
    be.from_host(staging, a_host.data());
    be.copy(a, staging);
    be.from_host(staging, b_host.data());
    be.copy(b, staging);
    GemmArgs g;
    g.m = g.n = g.k = n;
    g.a = a.data, g.b = b.data, g.c = c.data;
    g.lda = g.ldb = g.ldc = n;
    g.dtypes_of(a, b, c);
    be.gemm(g);  // creates the primitive
    const auto start = Clock::now();
    for (int run = 0; run < kMaxRuns; ++run) {
      const auto t0 = Clock::now();
      be.gemm(g);
      const auto t1 = Clock::now();
      const double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
      best = std::max(best, flops / (ms * 1e6));
      if (std::chrono::duration<double>(t1 - start).count() > kSecondsPerShape) break;
    }
  }
  // Where bf16 products are widened, the probe's grew the backend's GEMM scratch to 2n² floats,
  // more than a small model's step takes: given back, so that a run holds only its step's.
  be.release_scratch();
  return best;
}

std::optional<double> GemmPeak::utilization(double achieved_gflops) {
  // Twice per run at most: a machine that stays busy must not pay for it at every step.
  while (achieved_gflops > gflops_ && remeasured_ < 2) {
    ++remeasured_;
    gflops_ = std::max(gflops_, measure_gemm_peak_gflops(be_, dtype_));
  }
  if (gflops_ <= 0.0 || achieved_gflops > gflops_) return std::nullopt;
  return achieved_gflops / gflops_;
}

}  // namespace bottle
