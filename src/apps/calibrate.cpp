#include "apps/calibrate.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <vector>

#include "core/arena.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/gemm_peak.h"
#include "core/system_info.h"
#include "plan/cluster.h"
#include "train/memory_plan.h"

namespace bottle {
namespace {

using Clock = std::chrono::steady_clock;

// The best of `rounds` timings of `f`, each repeated until it has run `min_seconds`.
template <typename F>
double best_seconds(F&& f, int rounds = 5, double min_seconds = 0.05) {
  double best = 1e30;
  for (int round = 0; round < rounds; ++round) {
    int runs = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      f();
      ++runs;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (elapsed < min_seconds);
    best = std::min(best, elapsed / runs);
  }
  return best;
}

double copy_bandwidth_gbs(Backend& be) {
  Arena arena(MemoryTag::workspace, be);
  constexpr int64_t n = 16 << 20;  // 64 MiB each way: far beyond any cache
  Tensor a = arena.alloc({n}), b = arena.alloc({n});
  be.copy(b, a);
  const double s = best_seconds([&] { be.copy(b, a); });
  return 2.0 * double(a.nbytes()) / s / 1e9;
}

double kernel_overhead_us(Backend& be) {
  Arena arena(MemoryTag::workspace, be);
  Tensor a = arena.alloc({16}), b = arena.alloc({16});
  return best_seconds([&] { be.add(a, a, b); }) * 1e6;
}

// Forward and backward of causal attention at a head dim of 64: their FLOPs counted as the
// counting backend counts them (3.5 × the forward's) over the time.
double attention_tflops(Backend& be) {
  constexpr int64_t B = 1, S = 512, H = 8, hd = 64;
  Arena arena(MemoryTag::workspace, be);
  Tensor q = arena.alloc({B, S, H, hd}), k = arena.alloc({B, S, H, hd}),
         v = arena.alloc({B, S, H, hd}), out = arena.alloc({B, S, H, hd}),
         lse = arena.alloc({B, H, S}), dq = arena.alloc({B, S, H, hd}),
         dk = arena.alloc({B, S, H, hd}), dv = arena.alloc({B, S, H, hd}),
         dout = arena.alloc({B, S, H, hd});
  const double flops = 3.5 * 4.0 * B * H * hd * double(S) * double(S + 1) / 2.0;
  const double s = best_seconds([&] {
    be.attention_forward(out, lse, q, k, v);
    be.attention_backward(dq, dk, dv, dout, out, lse, q, k, v);
  });
  return flops / s / 1e12;
}

// Seconds of one all-reduce of `elements` floats over the world (the slowest rank's).
double all_reduce_seconds(Communicator& world, int64_t elements) {
  std::vector<float> data(size_t(elements), 1.0f);
  const Tensor t = host_tensor(std::span(data));
  world.barrier();
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    constexpr int kRuns = 8;
    world.barrier();
    const auto t0 = Clock::now();
    for (int run = 0; run < kRuns; ++run) world.all_reduce(t, ReduceOp::sum, "calibrate");
    best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count() / kRuns);
  }
  return reduce_scalar(&world, best, ReduceOp::max, "calibrate");
}

}  // namespace

void calibrate_cluster(Communicator& world, const std::string& path) {
  const int n = world.size();
  BOTTLE_CHECK(n >= 2,
               "plan --calibrate measures the collectives between ranks: run it under mpirun "
               "with as many ranks as the runs it should predict use per machine (e.g. mpirun "
               "-np 2 bottle plan --calibrate {})",
               path);
  const std::unique_ptr<Backend> be = make_backend("cpu");
  // The slowest rank's rate: the smallest, as minus the largest negated.
  auto slowest = [&](double v) { return -reduce_scalar(&world, -v, ReduceOp::max, "calibrate"); };
  ClusterSpec c;
  c.name = "calibrated";
  c.gpu_name = fmt::format("{} ({} thread(s) per rank)", cpu_model(), omp_get_max_threads());
  c.description = fmt::format(
      "this machine, {} ranks of {} thread(s), measured by bottle plan "
      "--calibrate",
      n, omp_get_max_threads());
  c.fp32_tflops = slowest(measure_gemm_peak_gflops(*be, DType::f32) / 1e3);
  c.bf16_tflops = slowest(measure_gemm_peak_gflops(*be, DType::bf16) / 1e3);
  c.memory_bandwidth_gbs = slowest(copy_bandwidth_gbs(*be));
  c.attention_tflops = slowest(attention_tflops(*be));
  c.kernel_overhead_us = reduce_scalar(&world, kernel_overhead_us(*be), ReduceOp::max, "calibrate");
  c.memory_gb = double(available_memory_bytes()) / 1e9 / n;
  c.gpus_per_node = n;
  // A ring all-reduce of S bytes: 2(n−1) steps of latency α plus 2(n−1)/n · S / β. The small
  // buffer gives α, the large one β.
  const int64_t small = 16, large = 4 << 20;
  const double t_small = all_reduce_seconds(world, small),
               t_large = all_reduce_seconds(world, large);
  c.intra_node.latency_us = t_small / (2.0 * (n - 1)) * 1e6;
  c.intra_node.bandwidth_gbs =
      2.0 * (n - 1) / n * double(large) * 4.0 / std::max(t_large - t_small, 1e-9) / 1e9;
  // One machine: no other node was measured, so the inter-node link is the same one.
  c.inter_node = c.intra_node;
  c.nccl_base_latency_us = 0;
  c.gemm_efficiency = c.bandwidth_efficiency = 1.0;
  if (world.rank() != 0) return;
  const std::string text = cluster_to_toml(
      c, fmt::format("Measured by `bottle plan --calibrate` on {} ranks of {} thread(s): every "
                     "rate is one reached here\n(best of several runs, the slowest rank's), so "
                     "both efficiency constants are 1.\nThe links are MPI's all-reduce between "
                     "these ranks; no other node was measured.",
                     n, omp_get_max_threads()));
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  BOTTLE_CHECK(out.good(), "{}: cannot write the cluster file", path);
  out << text;
  out.close();
  BOTTLE_CHECK(out.good(), "{}: cannot write the cluster file", path);
  std::printf("%s", text.c_str());
}

}  // namespace bottle
