// `bottle bench tp`'s command line: the options, the configuration and the keys it reads
// (bench/tp_bench.h runs it).
#include <fmt/format.h>

#include <algorithm>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "bench/tp_bench.h"
#include "comm/communicator.h"
#include "train/train_config.h"

namespace bottle {
namespace {

// What bench tp reads of a training configuration; a file's other training-run keys
// (data, checkpoints, the schedule) do not change the step it times.
const CommandKeys kBenchTpKeys{
    "bench tp",
    {"model.", "training.micro_batch_size", "training.seq_len", "training.seed",
     "training.recompute", "training.max_norm", "training.on_nonfinite", "training.precision",
     "optimizer.", "parallel.tp", "parallel.pp", "parallel.dp", "parallel.grouping",
     "parallel.tp_backward"},
    {"training.steps", "training.eval_interval", "training.eval_batches", "lr_scheduler.", "data.",
     "checkpoint.", "metrics."},
    "it times one training step (in training.precision) of one micro-batch of random tokens per "
    "TP mode (full, "
    "vanilla and btp side by side) on one TP group at the constant rate optimizer.lr, and plans "
    "memory with --fit"};

}  // namespace

Command add_bench_tp_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> overrides;
    int steps = 5, warmup = 2, threads = 0;
    bool json = false, variants = false, recompute = false, components = false, tp_overlap = false,
         tp_backward = false;
    std::string fit;
    int64_t fit_max = 64;
  };
  auto o = std::make_shared<Options>();
  app.add_option("config", o->config, "training configuration (TOML)")->required();
  app.add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  app.add_option("--steps", o->steps, "timed steps per mode")->check(integer_in(1, INT32_MAX));
  app.add_option("--warmup", o->warmup, "untimed steps first")->check(integer_in(0, INT32_MAX));
  app.add_option("--threads", o->threads, "OpenMP threads per rank (default: cores / ranks)")
      ->check(integer_in(1, kMaxThreads));
  app.add_flag("--json", o->json, "one JSON object per mode and line");
  app.add_flag("--variants", o->variants,
               "also time vanilla and btp with grouping switched, and btp with RMSNorm's "
               "backward statistic all-reduced instead of taken from the latent");
  app.add_flag("--recompute", o->recompute,
               "also time each mode under the other recompute policies (none, block; btp also "
               "lowrank) than training.recompute: activation MB saved per ms of recomputation");
  app.add_flag("--components", o->components,
               "time vanilla's and btp's q/k/v and gate/up groups apart: compute (GEMMs and "
               "latent stage) and all-reduce, forward + backward, with each call site's time");
  app.add_flag("--tp-overlap", o->tp_overlap,
               "also time each mode with parallel.tp_overlap (the micro-batch's blocks as two "
               "halves, one half's TP collectives under the other half's compute; needs an "
               "even training.micro_batch_size); under it each block site is called twice");
  app.add_flag("--tp-backward", o->tp_backward,
               "also time each mode with the other parallel.tp_backward (async: each input "
               "gradient's all-reduce under the weight gradient, Megatron's order; serial: "
               "after it), side by side: what the order buys each mode, and btp's speedup "
               "over full-rank TP with both in each order");
  app.add_option("--fit", o->fit,
                 "plan (without allocating or timing) the largest micro-batch each mode and "
                 "recompute policy fits per rank under this many bytes (\"80GiB\")");
  app.add_option("--fit-max", o->fit_max, "largest micro-batch --fit tries")
      ->check(integer_in(1, 1 << 20));
  return [o] {
    Communicator& world = world_communicator();
    std::vector<std::string> overrides = o->overrides;
    // The TP degree is the job's size unless the configuration or --set says otherwise.
    const bool tp_given = std::any_of(overrides.begin(), overrides.end(), [](const auto& s) {
      return s.rfind("parallel.tp=", 0) == 0;
    });
    if (!tp_given) overrides.push_back(fmt::format("parallel.tp={}", world.size()));
    ConfigKeysGiven given;
    const TrainConfig config = load_train_config(o->config, overrides, &given);
    check_honoured_keys(config, given, o->config, kBenchTpKeys);
    run_bench_tp(config,
                 BenchTpOptions{.config_path = o->config,
                                .recompute_from_set = given.set.count("training.recompute") > 0,
                                .steps = o->steps,
                                .warmup = o->warmup,
                                .threads = o->threads,
                                .json = o->json,
                                .variants = o->variants,
                                .recompute = o->recompute,
                                .components = o->components,
                                .tp_overlap = o->tp_overlap,
                                .tp_backward = o->tp_backward,
                                .fit = o->fit,
                                .fit_max = o->fit_max});
    return 0;
  };
}

}  // namespace bottle
