// `bottle bench step`'s command line: the options, the configuration and the keys it reads
// (bench/step_bench.h runs it).
#include <algorithm>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "backend/backend_options.h"
#include "bench/step_bench.h"
#include "train/memory_plan.h"
#include "train/train_config.h"

namespace bottle {
namespace {

// What bench step reads of a training configuration; a file's other training-run keys
// (data, checkpoints, the schedule) do not change the step it times.
const CommandKeys kBenchStepKeys{
    "bench step",
    {"model.", "training.micro_batch_size", "training.seq_len", "training.seed",
     "training.max_norm", "training.on_nonfinite", "training.precision", "training.backend",
     "training.attention", "optimizer."},
    {"training.steps", "training.eval_interval", "training.eval_batches", "lr_scheduler.", "data.",
     "checkpoint.", "metrics."},
    "it times one training step of one micro-batch on one process, keeping every activation, "
    "per model kind and precision, at the constant rate optimizer.lr"};

// bench step's command line: a configuration and its overrides, or the shape; and what to
// time (bench/step_bench.h).
struct BenchStepCommandOptions {
  std::string config;
  std::vector<std::string> overrides;
  BenchStepOptions run;
};

// The options whose presence, not only their value, says something.
struct BenchStepFlags {
  CLI::Option *config, *kv_heads, *kinds, *precisions, *backend, *attention;
};

BenchStepFlags add_bench_step_options(CLI::App& app, BenchStepCommandOptions* c) {
  BenchStepOptions* o = &c->run;
  CLI::Option* config = app.add_option("config", c->config,
                                       "TOML config: the model of [model], b and s of [training]");
  app.add_option("--set", c->overrides, "override a config key: section.key=value (repeatable)")
      ->needs(config);
  CLI::Option* kv_heads =
      app.add_option("--kv-heads", o->model.num_kv_heads, "key/value heads (default: --heads)");
  const std::vector<CLI::Option*> shape = {
      app.add_option("--vocab", o->model.vocab_size, "vocabulary size"),
      app.add_option("--hidden", o->model.hidden_size, "hidden width d"),
      app.add_option("--ffn", o->model.intermediate_size, "MLP width d_ff"),
      app.add_option("--layers", o->model.num_layers, "decoder blocks"),
      app.add_option("--heads", o->model.num_heads, "query heads"),
      kv_heads,
      app.add_option("--rank", o->model.rank, "bottleneck rank r"),
      app.add_option("--batch", o->batch, "micro-batch b"),
      app.add_option("--seq", o->seq, "sequence length s")};
  for (CLI::Option* opt : shape) opt->excludes(config)->check(integer_in(1));
  app.add_option("--optimizers", o->optimizers,
                 "comma-separated optimizer.name values, a row each (adamw, muon; default: the "
                 "config's); the update is timed inside the step, and a Muon row is compared "
                 "with AdamW's");
  CLI::Option* kinds = app.add_option(
      "--kinds", o->kinds,
      "comma-separated model kinds: none, svd, cola, lax (default: none,cola, or the config's)");
  CLI::Option* precisions = app.add_option(
      "--precision", o->precisions,
      "comma-separated: fp32, bf16 (\"fp32,bf16\": side by side; default: fp32, or the "
      "config's training.precision)");
  app.add_option("--steps", o->steps, "timed steps")->check(integer_in(1, INT32_MAX));
  app.add_option("--warmup", o->warmup, "untimed steps first")->check(integer_in(0, INT32_MAX));
  app.add_option("--threads", o->threads, "threads for bottle and PyTorch alike")
      ->check(integer_in(1, kMaxThreads));
  CLI::Option* backend =
      app.add_option("--backend", o->backend,
                     "kernel backend: cpu, reference or cuda (default: the config's "
                     "training.backend, else cpu)")
          ->check(
              CLI::IsMember(std::vector<std::string>(kBackendNames.begin(), kBackendNames.end())));
  CLI::Option* attention =
      app.add_option("--attention", o->attention,
                     "attention kernels: auto, cudnn or own (training.attention; default: the "
                     "config's, else auto)")
          ->check(CLI::IsMember(std::vector<std::string>(kAttentionChoiceNames.begin(),
                                                         kAttentionChoiceNames.end())));
  app.add_option("--peak-tflops", o->peak_tflops,
                 "a nominal dense peak in TFLOP/s (e.g. 989 for an H200's bf16): MFU is also "
                 "given against it")
      ->check(finite_in(1e-6, 1e9));
  app.add_option("--torch", o->torch,
                 "also time the PyTorch peer (true/false): on the CPU backends in fp32 rows, on "
                 "cuda on the same GPU in fp32 and bf16 (autocast) rows");
  app.add_option("--torch-blas", o->torch_blas,
                 "the CPU peer's OpenBLAS kernels: best (the best core the CPU's flags support, "
                 "over a weaker OPENBLAS_CORETYPE the environment pins; its first loss and "
                 "gradient norm must agree with bottle's, else the pinned core runs) or "
                 "environment (default: $BOTTLE_TORCH_BLAS, else best)")
      ->check(CLI::IsMember({"best", "environment"}));
  app.add_flag("--torch-compile", o->torch_compile,
               "also time the PyTorch peer under torch.compile (next to eager)");
  app.add_flag("--json", o->json, "one JSON object per kind");
  app.add_flag("--profile", o->profile,
               "also print the time per kernel (GEMMs per shape) of the timed steps");
  app.add_option("--save", o->save,
                 "write each kind's model after its steps and the tokens it stepped on to "
                 "DIR/KIND (config.json, model.safetensors, tokens.bin: a shard of that one "
                 "batch that `bottle train` reads)")
      ->check(output_directory());
  return {config, kv_heads, kinds, precisions, backend, attention};
}

// The step's settings, and the shape into `o`: the configuration's, or --hidden and the rest.
TrainConfig bench_step_base(BenchStepCommandOptions* c, const BenchStepFlags& f) {
  BenchStepOptions* o = &c->run;
  // The step's settings: a configuration's, or without one these fixed ones (TrainConfig's
  // defaults: seed 1234, max_norm 1.0, AdamW betas 0.9 and 0.95, weight decay 0.1) at lr 1e-3.
  TrainConfig base;
  base.optimizer.lr = 1e-3;
  if (f.config->count()) {
    ConfigKeysGiven given;
    base = load_train_config(c->config, c->overrides, &given);
    check_honoured_keys(base, given, c->config, kBenchStepKeys);
    o->model = base.model;
    o->batch = base.training.micro_batch_size;
    o->seq = base.training.seq_len;
    if (!f.kinds->count()) o->kinds = bottleneck_kind_name(base.model.bottleneck);
    if (!f.precisions->count()) o->precisions = enum_name(base.training.precision);
    if (!f.backend->count()) o->backend = enum_name(base.training.backend);
  } else if (!f.kv_heads->count()) {
    o->model.num_kv_heads = o->model.num_heads;
  }
  o->model.max_seq_len = std::max(o->model.max_seq_len, o->seq);
  base.training.micro_batch_size = o->batch;
  base.training.seq_len = o->seq;
  if (f.config->count())
    check_batch_shape(o->model, o->batch, o->seq, c->config + ": key",
                      "'training.micro_batch_size'", "'training.seq_len'");
  else
    check_batch_shape(o->model, o->batch, o->seq, "bench step:", "--batch", "--seq");
  return base;
}

}  // namespace

Command add_bench_step_command(CLI::App& app) {
  auto o = std::make_shared<BenchStepCommandOptions>();
  o->run.model.rank = 64;
  const BenchStepFlags flags = add_bench_step_options(app, o.get());
  return [o, flags] {
    const TrainConfig base = bench_step_base(o.get(), flags);
    BenchStepOptions run = o->run;
    if (flags.config->count()) run.config_path = o->config;
    // The backend: --backend, else the configuration's training.backend, else cpu.
    run.backend_from_config = flags.config->count() && !flags.backend->count();
    if (run.backend.empty()) run.backend = "cpu";
    if (!flags.attention->count()) run.attention = attention_choice_name(base.training.attention);
    run_bench_step(base, std::move(run));
    return 0;
  };
}

}  // namespace bottle
