// `bottle bench pipeline`'s command line: the options, the configuration and the keys it
// reads (bench/pipeline_bench.h runs it).
#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "bench/pipeline_bench.h"
#include "comm/communicator.h"
#include "train/train_config.h"

namespace bottle {
namespace {

// What bench pipeline reads of a training configuration; a file's other training-run keys
// (data, checkpoints, the schedule) do not change what it times.
const CommandKeys kBenchPipelineKeys{
    "bench pipeline",
    {"model.", "training.micro_batch_size", "training.seq_len", "training.grad_accum_steps",
     "training.seed", "training.recompute", "training.max_norm", "training.on_nonfinite",
     "training.precision", "optimizer.", "parallel.tp", "parallel.pp", "parallel.dp",
     "parallel.tp_mode", "parallel.zero", "parallel.grouping"},
    {"training.steps", "training.eval_interval", "training.eval_batches", "lr_scheduler.", "data.",
     "checkpoint.", "metrics."},
    "it times one training step (in training.precision) on random tokens under every pipeline "
    "schedule the model runs at the constant rate optimizer.lr"};

}  // namespace

Command add_bench_pipeline_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> overrides;
    int steps = 3, warmup = 1;
  };
  auto o = std::make_shared<Options>();
  app.add_option("config", o->config, "training configuration (TOML)")->required();
  app.add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  app.add_option("--steps", o->steps, "timed steps per variant")->check(integer_in(1, INT32_MAX));
  app.add_option("--warmup", o->warmup, "untimed steps first")->check(integer_in(0, INT32_MAX));
  return [o] {
    world_communicator();  // MPI starts before the configuration is read, as in bench tp
    ConfigKeysGiven given;
    const TrainConfig config = load_train_config(o->config, o->overrides, &given);
    check_honoured_keys(config, given, o->config, kBenchPipelineKeys);
    run_bench_pipeline(config, {.config_path = o->config, .steps = o->steps, .warmup = o->warmup});
    return 0;
  };
}

}  // namespace bottle
