#include "bench/calibrate.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <exception>
#include <filesystem>
#include <fstream>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "core/error.h"
#include "core/statistics.h"
#include "io/atomic_output.h"
#include "plan/cluster.h"
#include "sys/system_info.h"
#include "train/job_agreement.h"
#include "train/memory_plan.h"

namespace bottle {
namespace {

using Clock = std::chrono::steady_clock;

// The median of `rounds` timings of `f`, each repeated until it has run `min_seconds`: what a
// run sustains on a shared machine, where the best of many would be a lucky moment.
template <typename F>
double median_seconds(F&& f, int rounds = 7, double min_seconds = 0.1) {
  f();  // caches, pages and the library's kernel choice stay out of the timing
  std::vector<double> times;
  for (int round = 0; round < rounds; ++round) {
    int runs = 0;
    const auto t0 = Clock::now();
    double elapsed = 0;
    do {
      f();
      ++runs;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    } while (elapsed < min_seconds);
    times.push_back(elapsed / runs);
  }
  return median(times);
}

// c = a · b of three square n × n tensors (c in fp32).
GemmArgs square_gemm(const Tensor& a, const Tensor& b, const Tensor& c) {
  const int64_t n = a.shape[0];
  GemmArgs g;
  g.m = g.n = g.k = n;
  g.a = a.data, g.b = b.data, g.c = c.data;
  g.lda = g.ldb = g.ldc = n;
  g.dtypes_of(a, b, c);
  return g;
}

// TFLOP/s of a square product of n = 1024 in `dtype` (fp32 accumulation and output).
double gemm_tflops(Backend& be, DType dtype) {
  constexpr int64_t n = 1024;
  Arena arena(MemoryTag::workspace, be);
  Tensor a = arena.alloc({n, n}, dtype), b = arena.alloc({n, n}, dtype), c = arena.alloc({n, n});
  const GemmArgs g = square_gemm(a, b, c);
  return 2.0 * double(n) * double(n) * double(n) / median_seconds([&] { be.gemm(g); }) / 1e12;
}

// The rate GEMMs stream their operands at: thin products (one side 1/8 of the others, each
// operand layout a backward pass uses), their time less their FLOPs at `tflops`, over their
// bytes. 0 when the FLOPs alone account for the time.
double gemm_bandwidth_gbs(Backend& be, double tflops) {
  constexpr int64_t n = 1024, thin = 128;
  Arena arena(MemoryTag::workspace, be);
  Tensor a = arena.alloc({n, n}), b = arena.alloc({n, n}), c = arena.alloc({n, n});
  double seconds = 0, flops = 0, bytes = 0;
  for (auto [m, nn, k, ta, tb] :
       {std::tuple{n, thin, n, false, true}, std::tuple{n, thin, n, true, false},
        std::tuple{n, n, thin, false, false}}) {
    GemmArgs g;
    g.trans_a = ta, g.trans_b = tb;
    g.m = m, g.n = nn, g.k = k;
    g.a = a.data, g.b = b.data, g.c = c.data;
    g.lda = ta ? m : k, g.ldb = tb ? k : nn, g.ldc = nn;
    seconds += median_seconds([&] { be.gemm(g); });
    flops += 2.0 * double(m) * double(nn) * double(k);
    bytes += 4.0 * double(m * k + k * nn + m * nn);
  }
  const double streaming = seconds - flops / (tflops * 1e12);
  return streaming > 0 ? bytes / streaming / 1e9 : 0.0;
}

double copy_bandwidth_gbs(Backend& be) {
  Arena arena(MemoryTag::workspace, be);
  constexpr int64_t n = 16 << 20;  // 64 MiB each way: far beyond any cache
  Tensor a = arena.alloc({n}), b = arena.alloc({n});
  be.copy(b, a);
  const double s = median_seconds([&] { be.copy(b, a); });
  return 2.0 * double(a.nbytes()) / s / 1e9;
}

double kernel_overhead_us(Backend& be) {
  Arena arena(MemoryTag::workspace, be);
  Tensor a = arena.alloc({16}), b = arena.alloc({16});
  return median_seconds([&] { be.add(a, a, b); }) * 1e6;
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
  const double s = median_seconds([&] {
    be.attention_forward(out, lse, q, k, v);
    be.attention_backward(dq, dk, dv, dout, out, lse, q, k, v);
  });
  return flops / s / 1e12;
}

// Seconds of one all-reduce of `elements` floats over the world (the slowest rank's).
double all_reduce_seconds(Communicator& world, int64_t elements) {
  std::vector<float> data(size_t(elements), 1.0f);
  const Tensor t = host_tensor(std::span(data));
  world.all_reduce(t, ReduceOp::sum, "calibrate");
  std::vector<double> times;
  for (int round = 0; round < 7; ++round) {
    constexpr int kRuns = 8;
    world.barrier();
    const auto t0 = Clock::now();
    for (int run = 0; run < kRuns; ++run) world.all_reduce(t, ReduceOp::sum, "calibrate");
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count() / kRuns);
  }
  return reduce_scalar(&world, median(times), ReduceOp::max, "calibrate");
}

// What overlapping costs here: how much longer kernels take while this rank's collectives
// move beside them (overlap.compute_slowdown, s) and how much longer those collectives take
// than blocking (overlap.call_slowdown, c). A chain of started all-reduces of 1 MiB (about
// 0.15 s of them, blocking) runs on the communication thread while the caller runs square fp32
// GEMMs one after another until the chain has ended. The chain's span over the GEMM work done
// inside it (the GEMMs' count at their time alone, less the part of the last one past the
// chain's end) is 1 + s; the span over the chain's blocking time is 1 + c. Where the transfers
// take the cores whole (shared memory, which the thread polls at a real-time priority) the
// GEMMs barely move, and s is large: overlap then buys nothing. Each the median of 9 rounds,
// the slowest rank's, at least 0 and s at most 99.
std::pair<double, double> overlap_slowdowns(Communicator& world, Backend& be) {
  constexpr int64_t n = 256, elements = 1 << 18;
  constexpr double kMostSlowdown = 100.0;
  Arena arena(MemoryTag::workspace, be);
  Tensor a = arena.alloc({n, n}), b = arena.alloc({n, n}), c = arena.alloc({n, n});
  const GemmArgs g = square_gemm(a, b, c);
  const double gemm = median_seconds([&] { be.gemm(g); }, 5, 0.02);
  // Zeros: a chain of sums stays finite however long it is.
  std::vector<float> data(size_t(elements), 0.0f);  // [elements]
  const Tensor x = host_tensor(std::span(data));
  // Every rank starts as many calls (the slowest rank's count): the calls must match.
  const double per_call = all_reduce_seconds(world, elements);
  const int64_t chain = std::clamp<int64_t>(int64_t(0.15 / per_call), 2, 4096);
  std::vector<double> ratios, call_ratios;  // [rounds]
  for (int round = 0; round < 9; ++round) {
    world.barrier();
    std::vector<PendingCall> calls;  // [chain]
    calls.reserve(size_t(chain));
    const auto start = Clock::now();
    for (int64_t i = 0; i < chain; ++i)
      calls.push_back(world.start_all_reduce(x, ReduceOp::sum, "calibrate"));
    // The calls run in issue order: the last one's end is the chain's.
    std::atomic<bool> ended{false};
    Clock::time_point end;
    std::exception_ptr error;
    std::thread waiter([&] {
      try {
        calls.back().wait();
      } catch (...) {
        error = std::current_exception();
      }
      end = Clock::now();
      ended.store(true, std::memory_order_release);
    });
    int64_t gemms = 0;
    while (!ended.load(std::memory_order_acquire)) {
      be.gemm(g);
      ++gemms;
    }
    const auto after = Clock::now();
    waiter.join();
    if (error) std::rethrow_exception(error);
    for (PendingCall& call : calls) call.wait();
    const double span = std::chrono::duration<double>(end - start).count();
    const double work = double(gemms) * gemm - std::chrono::duration<double>(after - end).count();
    ratios.push_back(work > span / kMostSlowdown ? span / work : kMostSlowdown);
    call_ratios.push_back(span / (double(chain) * per_call));
  }
  const double slowest = reduce_scalar(&world, median(ratios), ReduceOp::max, "calibrate");
  const double calls = reduce_scalar(&world, median(call_ratios), ReduceOp::max, "calibrate");
  return {std::clamp(slowest - 1.0, 0.0, kMostSlowdown - 1.0), std::max(calls - 1.0, 0.0)};
}

// The cluster file of measurement `c` over `n` ranks, written whole to `path` and printed.
void write_calibration(const ClusterSpec& c, int n, const std::string& path) {
  const std::string text = cluster_to_toml(
      c,
      fmt::format("Measured by `bottle plan --calibrate` on {} ranks of {} thread(s): every "
                  "rate is one reached here\n(the median of several runs, the slowest rank's), so "
                  "both efficiency constants are 1.\nThe links are MPI's all-reduce between "
                  "these ranks; no other node was measured.\noverlap: how much longer GEMMs took "
                  "while 1 MiB all-reduces ran beside them (compute_slowdown),\nand those "
                  "all-reduces than blocking (call_slowdown).",
                  n, omp_get_max_threads()));
  // What plan reads back: a measurement it would refuse is an error here, not there.
  parse_cluster(text, path);
  // Whole or not at all (io/atomic_output.h): plan never reads half a cluster file.
  write_file_atomically(path, text);
  fmt::print("{}", text);
}

}  // namespace

void calibrate_cluster(Communicator& world, const std::string& path) {
  const int n = world.size();
  BOTTLE_CHECK(n >= 2,
               "plan --calibrate measures the collectives between ranks: run it under mpirun "
               "with as many ranks as the runs it should predict use per machine (e.g. mpirun "
               "-np 2 bottle plan --calibrate {})",
               path);
  // Before any measurement, on every rank: a path that is a device, FIFO or directory is
  // refused (it would be replaced by a plain file), and so is one that cannot be written.
  run_on_root_or_fail_together(world, 0, [&] {
    check_output_file(path, "plan --calibrate's cluster file");
    const std::string folder = std::filesystem::path(path).parent_path().string();
    std::error_code ec;
    BOTTLE_CHECK(folder.empty() || std::filesystem::is_directory(folder, ec),
                 "{}: the folder of plan --calibrate's cluster file does not exist", folder);
  });
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
  const double my_fp32_tflops = gemm_tflops(*be, DType::f32);
  c.fp32_tflops = slowest(my_fp32_tflops);
  c.bf16_tflops = slowest(gemm_tflops(*be, DType::bf16));
  c.memory_bandwidth_gbs = slowest(copy_bandwidth_gbs(*be));
  c.gemm_bandwidth_gbs = slowest(gemm_bandwidth_gbs(*be, my_fp32_tflops));
  c.attention_tflops = slowest(attention_tflops(*be));
  c.kernel_overhead_us = reduce_scalar(&world, kernel_overhead_us(*be), ReduceOp::max, "calibrate");
  c.memory_gib = double(available_memory_bytes()) / double(1 << 30) / n;
  BOTTLE_CHECK(c.memory_gib > 0,
               "plan --calibrate: this machine's available memory is unknown "
               "(no MemAvailable in /proc/meminfo, no cgroup limit)");
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
  std::tie(c.overlap_compute_slowdown, c.overlap_call_slowdown) = overlap_slowdowns(world, *be);
  // Rank 0 writes; a failure (a full disk, the path taken meanwhile) fails every rank with its
  // message, so that the job's exit status says the file was not written.
  run_on_root_or_fail_together(world, 0, [&] { write_calibration(c, n, path); });
}

}  // namespace bottle
