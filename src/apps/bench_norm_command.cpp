// `bottle bench norm`: the online RMSNorm of BOOST §4.2 (parallel/online_rmsnorm.h) with a
// row-split linear layer on the t ranks of the job (under mpirun -np t), against RMSNorm
// + the whole linear layer on one rank, in fp32: the max and mean absolute difference of
// the layer output (the paper: max 7e-7, mean 6e-8 on 4 GPUs) and of the input gradient.
// On the cpu backend the difference is mostly the GEMMs' fp32 summation order, which
// differs between K = d on one rank and K = d/t per rank; `--backend reference` sums in
// double, which leaves the online algorithm's own error (at small shapes: it is slow).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "bench/online_rmsnorm_check.h"
#include "bench/results.h"
#include "comm/communicator.h"
#include "backend/backend_options.h"

namespace bottle {

Command add_bench_norm_command(CLI::App& app) {
  struct Options {
    int64_t rows = 4096, hidden = 4096, rank = 1024;
    uint32_t seed = 3;
    int threads = 0;
    std::string backend = "cpu";
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--rows", o->rows, "tokens (rows of the input)")->check(integer_in(1));
  app.add_option("--hidden", o->hidden, "hidden width d, split over the ranks")
      ->check(integer_in(1));
  app.add_option("--rank", o->rank, "output width r of the linear layer (a bottleneck's A)")
      ->check(integer_in(1));
  app.add_option("--seed", o->seed, "seed of the inputs, γ, A and the output gradient")
      ->check(integer_in(0, UINT32_MAX));
  app.add_option("--backend", o->backend, "cpu, or reference (GEMMs summed in double)")
      ->check(CLI::IsMember(host_backend_names()));
  app.add_option("--threads", o->threads, "OpenMP threads per rank (default: cores / ranks)")
      ->check(integer_in(1, kMaxThreads));
  app.add_flag("--json", o->json, "one JSON object");
  return [o] {
    Communicator& world = world_communicator();
    const int t = world.size();
    // Checked from values every rank has, so every rank fails alike before any collective.
    BOTTLE_CHECK(o->hidden % t == 0,
                 "bench norm: --hidden {} must be divisible by the number of ranks ({})", o->hidden,
                 t);
    omp_set_num_threads(o->threads > 0 ? o->threads : std::max(1, omp_get_num_procs() / t));
    // Realistic scales: unit inputs and output gradient, γ near 1, and A's std 1/sqrt(d),
    // which keeps the layer output at unit scale too.
    OnlineNormProblem problem;
    problem.rows = o->rows;
    problem.hidden = o->hidden;
    problem.rank = o->rank;
    problem.weight_std = 1.0f / std::sqrt(float(o->hidden));
    problem.seed = o->seed;
    auto be = make_backend(o->backend);
    const OnlineNormDiffs diffs =
        compare_online_rmsnorm(*be, TensorParallel{.comm = &world}, problem);
    if (world.rank() != 0) return 0;
    if (o->json) {
      const NormRow row{.tp = t,
                        .rows = o->rows,
                        .hidden = o->hidden,
                        .rank = o->rank,
                        .backend = o->backend,
                        .max_abs_diff = diffs.output.max,
                        .mean_abs_diff = diffs.output.mean,
                        .bwd_max_abs_diff = diffs.input_grad.max,
                        .bwd_mean_abs_diff = diffs.input_grad.mean};
      fmt::print("{}\n", to_json(row).dump());
    } else {
      fmt::print(
          "bench norm: online RMSNorm + row-split linear on {} rank(s) vs RMSNorm + linear on "
          "one rank, x [{}, {}] ~ N(0, 1), A [{}, {}] ~ N(0, 1/d), fp32, {} backend\n"
          "  output          max {:.2e}  mean {:.2e}  (paper, 4 GPUs: max 7e-7, mean 6e-8)\n"
          "  input gradient  max {:.2e}  mean {:.2e}\n",
          t, o->rows, o->hidden, o->rank, o->hidden, o->backend, diffs.output.max,
          diffs.output.mean, diffs.input_grad.max, diffs.input_grad.mean);
    }
    std::fflush(stdout);
    return 0;
  };
}

}  // namespace bottle
