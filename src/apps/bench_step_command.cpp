// `bottle bench step`: the training step of `bottle train` (train/train_step.h: forward +
// backward, the global gradient norm, clipping, AdamW) timed on one process for each model
// kind, on the cpu, reference or cuda backend, next to the same step in PyTorch run in the same
// invocation (on the CPU, or on the same GPU: eager, and torch.compile'd with
// --torch-compile), with achieved GFLOP/s and MFU against a GEMM peak measured here and now
// (and against a nominal peak given with --peak-tflops).
#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "bench/torch_peer.h"
#include "core/arena.h"
#include "backend/backend_options.h"
#include "backend/gemm_peak.h"
#include "backend/profiling_backend.h"
#include "core/statistics.h"
#include "sys/system_info.h"
#include "io/token_shard.h"
#include "model/checkpoint.h"
#include "train/memory_plan.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;

// The kernels' times per step, beside the measured step (`step_ms`, the median): the sum of
// the parts falls short of the step by what is no kernel (host time the device waits for,
// collectives on their own stream).
void print_profile(const std::map<std::string, KernelTime>& times, int64_t steps, double step_ms) {
  std::vector<std::pair<std::string, KernelTime>> rows(times.begin(), times.end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0.0;
  for (const auto& [name, t] : rows) total += t.ms;
  fmt::print("  {:<40} {:>8} {:>9} {:>6} {:>9}\n", "kernel (per step)", "calls", "ms", "%",
             "GFLOP/s");
  for (const auto& [name, t] : rows)
    fmt::print("  {:<40} {:>8.0f} {:>9.2f} {:>5.1f}% {:>9}\n", name,
               double(t.calls) / double(steps), t.ms / double(steps), 100.0 * t.ms / total,
               t.flops > 0 ? fmt::format("{:.0f}", t.flops / (t.ms * 1e6)) : "");
  fmt::print("  {:<40} {:>8} {:>9.2f}   of a {:.2f} ms step ({:.0f}%)\n", "total in kernels", "",
             total / double(steps), step_ms, 100.0 * total / double(steps) / step_ms);
}

// The same profile in a kind's JSON row: backend ops (launches) and milliseconds in them per
// step, attention's share, and each op's calls and milliseconds per step (what the GPU window's
// summary reads: scripts/gpu_check.sh).
void add_profile(nlohmann::ordered_json& row, const std::map<std::string, KernelTime>& times,
                 int64_t steps) {
  double calls = 0.0, ms = 0.0, attention_ms = 0.0;
  nlohmann::ordered_json ops = nlohmann::ordered_json::object();
  for (const auto& [name, t] : times) {
    calls += double(t.calls);
    ms += t.ms;
    if (name.starts_with("attention")) attention_ms += t.ms;
    ops[name] = {{"calls", double(t.calls) / double(steps)}, {"ms", t.ms / double(steps)}};
  }
  row["ops_per_step"] = calls / double(steps);
  row["kernel_ms_per_step"] = ms / double(steps);
  row["attention_ms_per_step"] = attention_ms / double(steps);
  row["profile"] = std::move(ops);
}

// The line of backend_names() that describes `name`, e.g. "cuda: CUDA runtime 13.0, ...".
std::string backend_description(const std::string& name) {
  for (const std::string& line : backend_names())
    if (line.starts_with(name + ":")) return line;
  return name;
}

// --torch-blas, or its default: $BOTTLE_TORCH_BLAS, else best.
bool torch_blas_best(const std::string& option) {
  if (!option.empty()) return option == "best";
  const char* env = std::getenv("BOTTLE_TORCH_BLAS");
  return env == nullptr || std::string(env) != "environment";
}

// Why the peer's first step does not match bottle's (the same weights and batch, fp32): its
// loss or gradient norm more than 1e-3 apart, relatively; empty when they agree. A peer on
// other OpenBLAS kernels computes the same step to rounding, far inside that.
std::string disagreement(const TorchStep& torch, const StepResult& first) {
  auto apart = [](double a, double b) {
    return !(std::abs(a - b) <= 1e-3 * std::max(std::abs(a), std::abs(b)));
  };
  if (apart(torch.first_loss, first.loss) || apart(torch.first_grad_norm, first.grad_norm))
    return fmt::format("its first step disagrees with bottle's (loss {:.6g} vs {:.6g}, gradient "
                       "norm {:.6g} vs {:.6g})",
                       torch.first_loss, first.loss, torch.first_grad_norm, first.grad_norm);
  return {};
}

}  // namespace

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

namespace {

// bench step's options: the model's shape, or a configuration giving it, and what to time.
struct BenchStepOptions {
  std::string config;
  std::vector<std::string> overrides;
  ModelConfig model;
  std::string kinds = "none,cola";
  std::string precisions = "fp32";
  int64_t batch = 8, seq = 256, steps = 10, warmup = 3;
  int threads = 2;
  std::string save;        // --save: a folder for each kind's model after its steps
  std::string backend;     // --backend; empty: the config's training.backend, else cpu
  std::string attention;   // --attention; empty: the config's training.attention, else auto
  double peak_tflops = 0;  // --peak-tflops; 0: none given
  bool torch = true, torch_compile = false, json = false, profile = false;
  // --torch-blas: "best" (OpenBLAS's best core for the CPU over a weaker pinned one) or
  // "environment"; the default is $BOTTLE_TORCH_BLAS, else best (the tests set environment).
  std::string torch_blas;
};

// The options whose presence, not only their value, says something.
struct BenchStepFlags {
  CLI::Option *config, *kv_heads, *kinds, *precisions, *backend, *attention;
};

BenchStepFlags add_bench_step_options(CLI::App& app, BenchStepOptions* o) {
  CLI::Option* config = app.add_option("config", o->config,
                                       "TOML config: the model of [model], b and s of [training]");
  app.add_option("--set", o->overrides, "override a config key: section.key=value (repeatable)")
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
      ->check(output_path());
  return {config, kv_heads, kinds, precisions, backend, attention};
}

// The step's settings, and the shape into `o`: the configuration's, or --hidden and the rest.
TrainConfig bench_step_base(BenchStepOptions* o, const BenchStepFlags& f) {
  // The step's settings: a configuration's, or without one these fixed ones (TrainConfig's
  // defaults: seed 1234, max_norm 1.0, AdamW betas 0.9 and 0.95, weight decay 0.1) at lr 1e-3.
  TrainConfig base;
  base.optimizer.lr = 1e-3;
  if (f.config->count()) {
    ConfigKeysGiven given;
    base = load_train_config(o->config, o->overrides, &given);
    check_honoured_keys(base, given, o->config, kBenchStepKeys);
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
    check_batch_shape(o->model, o->batch, o->seq, o->config + ": key",
                      "'training.micro_batch_size'", "'training.seq_len'");
  else
    check_batch_shape(o->model, o->batch, o->seq, "bench step:", "--batch", "--seq");
  return base;
}

// --precision's comma-separated list.
std::vector<Precision> parse_precisions(const std::string& names) {
  std::vector<Precision> precision_list;
  std::stringstream list(names);
  for (std::string name; std::getline(list, name, ',');) {
    BOTTLE_CHECK(name == "fp32" || name == "bf16",
                 "--precision: '{}' is not a precision (fp32 or bf16)", name);
    precision_list.push_back(name == "bf16" ? Precision::bf16 : Precision::fp32);
  }
  BOTTLE_CHECK(!precision_list.empty(), "--precision: no precision given");
  return precision_list;
}

// The backend of --backend (or the configuration's), with --attention's kernels.
std::unique_ptr<Backend> open_bench_backend(BenchStepOptions* o, const BenchStepFlags& f,
                                            const TrainConfig& base) {
  if (o->backend.empty()) o->backend = "cpu";
  if (const std::string why = backend_unavailable(o->backend); !why.empty()) {
    if (f.backend->count() || !f.config->count())
      fail("bench step: --backend {}: {}", o->backend, why);
    fail("{}: training.backend = \"{}\": {} (choose another with --backend)", o->config, o->backend,
         why);
  }
  if (!f.attention->count()) o->attention = attention_choice_name(base.training.attention);
  const AttentionChoice attention_choice = parse_attention_choice(o->attention);
  std::unique_ptr<Backend> be;
  try {
    be = make_backend(o->backend, {attention_choice});
  } catch (const Error& e) {
    if (attention_choice != AttentionChoice::cudnn) throw;
    fail("bench step: --attention cudnn (training.attention): {}", e.what());
  }
  return be;
}

// The run's first line: which attention runs at this shape in each precision, and why (the
// cuda backend builds cuDNN's graphs here, before any step is timed).
void print_attention_paths(Backend* be, const BenchStepOptions* o,
                           const std::vector<Precision>& precision_list) {
  std::string attention_text;
  for (const Precision precision : precision_list)
    attention_text += fmt::format(
        "{}{}{}", attention_text.empty() ? "" : "; ",
        precision_list.size() > 1 ? fmt::format("{}: ", enum_name(precision)) : std::string(),
        be->attention_path(o->batch, o->seq, o->model.num_heads, o->model.num_kv_heads,
                           o->model.head_dim(), compute_dtype(precision)));
  if (!o->json) fmt::print("attention: {}\n", attention_text);
}

// The lines before the rows: the shape, the GEMM peaks, the CPU, the backend, how --profile
// times and the bf16 GEMMs' path.
void print_bench_header(Backend* be, const BenchStepOptions* o, const std::string& peak_text,
                        const ProfilingBackend* profiler, bool on_device,
                        const std::vector<Precision>& precision_list) {
  if (!o->json)
    fmt::print(
        "bench step: V={} d={} d_ff={} L={} H={} s={} b={} {}, {} threads; GEMM "
        "peak {}\nCPU: {}\n",
        o->model.vocab_size, o->model.hidden_size, o->model.intermediate_size, o->model.num_layers,
        o->model.num_heads, o->seq, o->batch, o->precisions, o->threads, peak_text, cpu_summary());
  if (!o->json && o->backend != "cpu") fmt::print("backend: {}\n", backend_description(o->backend));
  if (!o->json && profiler && on_device)
    fmt::print(
        "--profile: each kernel between two events on the stream, read after the steps (no "
        "wait per kernel)\n");
  const bool any_bf16 = std::count(precision_list.begin(), precision_list.end(), Precision::bf16);
  if (!o->json && any_bf16) fmt::print("bf16 GEMMs: {}\n", be->bf16_gemm_path());
}

// The GEMM peak of each precision, and the nominal one where --peak-tflops gives it.
std::string describe_peaks(const std::map<Precision, std::unique_ptr<GemmPeak>>& peaks,
                           double peak_tflops) {
  std::string peak_text;
  for (const auto& [precision, peak] : peaks)
    peak_text += fmt::format("{}{:.0f} GFLOP/s ({})", peak_text.empty() ? "" : ", ", peak->gflops(),
                             enum_name(precision));
  if (peak_tflops > 0) peak_text += fmt::format("; nominal peak {:g} TFLOP/s", peak_tflops);
  return peak_text;
}

// The step of `bottle train` on one process, at the constant rate optimizer.lr, for one kind
// of `model` in one precision.
TrainConfig kind_config(const TrainConfig& base, const ModelConfig& model, const std::string& kind,
                        Precision precision) {
  TrainConfig train_config = bench_step_config(base);
  train_config.training.precision = precision;
  train_config.model = model;
  train_config.model.bottleneck = parse_bottleneck_kind(kind);
  train_config.parallel.tp_mode = &default_tp_layout(train_config.model.shape());
  return train_config;
}

// One batch of b rows of s tokens (n in all), stepped on every step: rows of a fixed stream, the
// targets the inputs shifted by one, as a token shard's window gives them.
std::vector<int32_t> batch_stream(int64_t n, int64_t vocab_size) {
  std::vector<int32_t> stream(size_t(n + 1));
  for (size_t i = 0; i < stream.size(); ++i)
    stream[i] = int32_t((i * 2654435761u) % uint64_t(vocab_size));
  return stream;
}

// Refusals before a kind's steps: a --save folder that cannot be written, and a host backend's
// model and step that do not fit the host's memory.
void check_before_steps(const BenchStepOptions* o, const std::string& kind,
                        const TrainConfig& train_config, bool on_device) {
  const ModelConfig& config = train_config.model;
  // A folder --save cannot write into is refused before any step.
  if (!o->save.empty()) {
    try {
      check_new_model_directory((fs::path(o->save) / kind).string());
    } catch (const Error& e) {
      fail("--save: {}", e.what());
    }
  }
  // The host's memory bounds a host backend's run; a device's allocator refuses what
  // does not fit it, naming its free memory.
  if (!on_device) {
    const std::string what = fmt::format("bench step: the {} model", kind),
                      advice = "lower --batch, --seq or the model's size";
    check_parameter_memory(config, true, 1, 1, 1, world_communicator(), what, advice);
    check_available_memory(
        plan_rank_memory(train_config, tensor_parallel_of(train_config, nullptr), {}, 1),
        world_communicator(), what, advice);
  }
}

// What a kind's timed steps measured.
struct TimedSteps {
  Spread t;
  StepResult first, last;  // the first step's (the peer's check) and the last timed step's
  std::map<std::string, KernelTime> step_kernels;  // the timed steps' (--profile)
  double host_waits = 0;  // per timed step: the host waiting for the device
  double flops = 0;
};

// The kind's steps on one batch (`stream`, n tokens): the model's copy for the peer, the
// warm-up, then the timed steps; then, while the model lives, its copy for --save (with the
// first precision).
TimedSteps run_timed_steps(const TrainConfig& train_config, Backend* be, ProfilingBackend* profiler,
                           const BenchStepOptions* o, const std::vector<int32_t>& stream, int64_t n,
                           const std::string& kind, Precision precision,
                           const std::vector<Precision>& precision_list, bool torch_row,
                           const fs::path& peer_dir) {
  TimedSteps r;
  TrainStep train_step(train_config, *be, tensor_parallel_of(train_config, nullptr), nullptr,
                       nullptr);
  LlamaModel& model = train_step.model();
  model.init_weights(uint64_t(train_config.training.seed));
  train_step.allocate_activations();
  be->from_host(train_step.inputs()[0], stream.data());
  be->from_host(train_step.targets()[0], stream.data() + 1);
  // The peer starts from the weights bottle's first step starts from, so that its first loss
  // and gradient norm can be checked against bottle's before its time is quoted.
  if (torch_row) {
    save_model(model, peer_dir.string());
    write_token_shard((peer_dir / "tokens.bin").string(), stream);
  }
  // TrainStep times each step to its last kernel's end (a device backend's waited for).
  std::vector<double> ms;
  int64_t waits_before = 0;  // the backend's host waits when the timed steps start
  for (int64_t step = 0; step < o->warmup + o->steps; ++step) {
    if (step == o->warmup) {
      if (profiler) profiler->reset();
      waits_before = be->host_waits();
    }
    r.last = train_step.step(step);
    if (step == 0) r.first = r.last;
    if (step >= o->warmup) ms.push_back(r.last.seconds * 1e3);
  }
  r.host_waits = double(be->host_waits() - waits_before) / double(o->steps);
  r.t = spread_of(ms);
  // Before the model is copied out for --save and the peer, which is not step work.
  if (profiler) r.step_kernels = profiler->times();
  r.flops = model.flops_per_step(n, o->seq);
  if (!o->save.empty() && precision == precision_list.front()) {
    const fs::path dir = fs::path(o->save) / kind;
    save_model(model, dir.string());
    write_token_shard((dir / "tokens.bin").string(), stream);
  }
  return r;
}

// A kind's row in one precision, the peer's columns still to come.
nlohmann::ordered_json step_row(const BenchStepOptions* o, Backend* be, const std::string& kind,
                                Precision precision, const std::vector<Precision>& precision_list,
                                const ModelConfig& config, const TimedSteps& timed, int64_t n,
                                double gflops, const GemmPeak& peak, std::optional<double> mfu,
                                double mfu_nominal, bool on_device, double baseline_ms,
                                double first_precision_ms) {
  const Spread& t = timed.t;
  const StepResult& last = timed.last;
  const double host_waits = timed.host_waits;
  nlohmann::ordered_json row = {
      {"kind", kind},
      {"precision", enum_name(precision)},
      {"backend", o->backend},
      {"rank", config.bottleneck == BottleneckKind::none ? 0 : config.rank_of(ProjectionId::q)},
      {"params", config.parameter_count()},
      {"ms_per_step", t.median},
      {"ms_min", t.min},
      {"ms_max", t.max},
      {"tokens_per_s", double(n) / (t.median / 1e3)},
      {"gflops", gflops},
      {"mfu", mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr)},
      {"gemm_peak_gflops", peak.gflops()}};
  if (o->peak_tflops > 0) {
    row["mfu_nominal"] = mfu_nominal;
    row["nominal_peak_tflops"] = o->peak_tflops;
  }
  if (o->backend != "cpu") row["device"] = backend_description(o->backend);
  // Asked again: the backend prepared this shape before the first step, so this is cached.
  row["attention"] = be->attention_path(o->batch, o->seq, config.num_heads, config.num_kv_heads,
                                        config.head_dim(), compute_dtype(precision));
  row["cpu"] = cpu_model();
  row["onednn_isa"] = onednn_isa();
  if (on_device) row["host_waits_per_step"] = host_waits;
  row["loss"] = last.loss;
  row["grad_norm"] = last.grad_norm;
  row["lr"] = last.lr;
  row["peak_bytes"] = MemoryStats::global().peak_total();
  if (precision == Precision::bf16) row["bf16_gemm_path"] = be->bf16_gemm_path();
  if (config.bottleneck != BottleneckKind::none && baseline_ms > 0 &&
      precision == precision_list.front())
    row["speedup_vs_full_rank"] = baseline_ms / t.median;
  if (precision != precision_list.front())
    row[fmt::format("speedup_vs_{}", enum_name(precision_list.front()))] =
        first_precision_ms / t.median;
  return row;
}

// A kind's row in one precision as text; `peer_text`: the peer's part of the line.
void print_step_line(const BenchStepOptions* o, const std::string& kind, Precision precision,
                     const ModelConfig& config, const Spread& t, int64_t n, double gflops,
                     std::optional<double> mfu, double mfu_nominal, bool on_device,
                     double host_waits, const nlohmann::ordered_json& row,
                     const std::string& peer_text) {
  std::string mfu_text = mfu ? fmt::format("{:.1f}%", 100.0 * *mfu)
                             : std::string(on_device ? "n/a (above the measured peak)"
                                                     : "n/a (peak measured while busy)");
  if (o->peak_tflops > 0)
    mfu_text += fmt::format(" of measured GEMM peak, {:.1f}% of {:g} TFLOP/s nominal",
                            100.0 * mfu_nominal, o->peak_tflops);
  fmt::print(
      "{:<5} {:<4} {:9} params  {:>8.1f} ms/step [{:.1f}-{:.1f}]  {:>9.0f} tok/s  {:>6.1f} GFLOP/s "
      " MFU {}",
      kind, enum_name(precision), config.parameter_count(), t.median, t.min, t.max,
      double(n) / (t.median / 1e3), gflops, mfu_text);
  if (row.contains("speedup_vs_full_rank"))
    fmt::print("  {:.2f}x vs full-rank", row["speedup_vs_full_rank"].get<double>());
  for (const char* other : {"fp32", "bf16"})
    if (row.contains(fmt::format("speedup_vs_{}", other)))
      fmt::print("  {:.2f}x vs {}", row[fmt::format("speedup_vs_{}", other)].get<double>(), other);
  fmt::print("{}\n", peer_text);
  if (on_device) fmt::print("      host waits for the device: {:.1f} per step\n", host_waits);
}

}  // namespace

// The PyTorch peer's columns of a kind's row, from the model and batch in `peer_dir`, and its
// part of the printed line. On the CPU in fp32 (CPU autocast is not the peer we time against);
// on a GPU on the same GPU, fp32 as fp32 and bf16 as autocast-bf16 over fp32 weights. A GPU
// run goes on when the peer fails (no CUDA PyTorch there, say), saying why.
std::string peer_columns(const BenchStepOptions* o, bool on_device, Precision precision,
                         const fs::path& peer_dir, const TimedSteps& timed,
                         nlohmann::ordered_json& row) {
  const Spread& t = timed.t;
  std::string peer_text;
  TorchBenchMode mode;
  mode.device = on_device ? "cuda" : "cpu";
  mode.dtype = precision == Precision::bf16 ? "autocast-bf16" : "f32";
  auto run_peer = [&](bool compile) -> std::optional<TorchStep> {
    mode.compile = compile;
    try {
      return run_torch_bench(peer_dir.string(), (peer_dir / "tokens.bin").string(),
                             o->batch, o->seq, o->steps, o->warmup, o->threads, mode);
    } catch (const Error& e) {
      if (!on_device && !compile) throw;
      const std::string what = e.what();
      row[compile ? "torch_compile_error" : "torch_error"] =
          what.substr(0, what.find('\n'));
      if (compile) row["torch_compile_failed"] = true;
      return std::nullopt;
    }
  };
  // On the CPU the peer runs OpenBLAS's best kernels for this CPU (--torch-blas best) when the
  // environment pins weaker ones, if its first step agrees with bottle's.
  mode.best_blas = !on_device && torch_blas_best(o->torch_blas);
  std::optional<TorchStep> torch = run_peer(false);
  std::string blas_fallback;  // why the pinned core ran after all
  if (torch && mode.best_blas && !torch->blas_core_pinned.empty()) {
    if (const std::string why = disagreement(*torch, timed.first); !why.empty()) {
      blas_fallback = fmt::format("OpenBLAS {} over the pinned {}: {}; ran the pinned core",
                                  torch->blas_core, torch->blas_core_pinned, why);
      mode.best_blas = false;
      torch = run_peer(false);
    }
  }
  if (torch) {
    row["torch_ms_per_step"] = torch->ms_median;
    row["torch_ms_min"] = torch->ms_min;
    row["torch_ms_max"] = torch->ms_max;
    row["torch_version"] = torch->version;
    row["torch_blas_core"] = torch->blas_core;
    row["torch_blas_core_source"] = torch->blas_core_source;
    row["torch_blas_core_pinned"] = torch->blas_core_pinned;
    if (!blas_fallback.empty()) row["torch_blas_fallback"] = blas_fallback;
    row["torch_first_loss"] = torch->first_loss;
    row["torch_first_grad_norm"] = torch->first_grad_norm;
    row["first_loss"] = timed.first.loss;
    row["first_grad_norm"] = timed.first.grad_norm;
    row["torch_device"] = torch->device;
    row["torch_dtype"] = torch->dtype;
    row["torch_attention"] = torch->attention;
    if (!torch->gpu.empty()) row["torch_gpu"] = torch->gpu;
    row["speedup_vs_torch"] = torch->ms_median / t.median;
    const std::string kernels =
        torch->blas_core_pinned.empty()
            ? torch->blas_core
            : fmt::format("{}, pinned {}", torch->blas_core, torch->blas_core_pinned);
    peer_text += on_device
                     ? fmt::format(
                           "  | PyTorch {} eager ({}, {}) {:.1f} ms/step "
                           "[{:.1f}-{:.1f}]: bottle {:.2f}x",
                           torch->version, torch->dtype, torch->attention, torch->ms_median,
                           torch->ms_min, torch->ms_max, torch->ms_median / t.median)
                     : fmt::format(
                           "  | PyTorch {} (OpenBLAS {}) {:.1f} ms/step "
                           "[{:.1f}-{:.1f}]: bottle {:.2f}x",
                           torch->version, kernels, torch->ms_median,
                           torch->ms_min, torch->ms_max, torch->ms_median / t.median);
    if (!blas_fallback.empty()) peer_text += fmt::format(" ({})", blas_fallback);
  } else {
    peer_text += fmt::format("  | PyTorch: {}", row["torch_error"].get<std::string>());
  }
  if (o->torch_compile) {
    const std::optional<TorchStep> compiled = run_peer(true);
    if (compiled && !compiled->compile_failed) {
      row["torch_compile_ms_per_step"] = compiled->ms_median;
      row["torch_compile_ms_min"] = compiled->ms_min;
      row["torch_compile_ms_max"] = compiled->ms_max;
      row["speedup_vs_torch_compile"] = compiled->ms_median / t.median;
      peer_text += fmt::format(
          "  | torch.compile {:.1f} ms/step [{:.1f}-{:.1f}]: bottle "
          "{:.2f}x",
          compiled->ms_median, compiled->ms_min, compiled->ms_max,
          compiled->ms_median / t.median);
    } else {
      if (compiled) {
        row["torch_compile_failed"] = true;
        row["torch_compile_error"] = compiled->compile_error;
      }
      peer_text += fmt::format("  | torch.compile failed: {}",
                               row["torch_compile_error"].get<std::string>());
    }
  }
  fs::remove_all(peer_dir);
  fs::remove_all(peer_dir);
  return peer_text;
}

Command add_bench_step_command(CLI::App& app) {
  auto o = std::make_shared<BenchStepOptions>();
  o->model.rank = 64;
  const BenchStepFlags flags = add_bench_step_options(app, o.get());
  return [o, flags] {
    omp_set_num_threads(o->threads);
    const TrainConfig base = bench_step_base(o.get(), flags);
    const std::vector<Precision> precision_list = parse_precisions(o->precisions);
    std::unique_ptr<Backend> be = open_bench_backend(o.get(), flags, base);
    print_attention_paths(be.get(), o.get(), precision_list);
    const bool on_device = be->device() != Device::cpu;
    // Measured before the profiler wraps the backend, so the profile counts the step's kernels
    // alone; each precision's MFU against its own GEMMs' peak.
    std::map<Precision, std::unique_ptr<GemmPeak>> peaks;
    for (const Precision precision : precision_list)
      if (!peaks.count(precision))
        peaks[precision] = std::make_unique<GemmPeak>(*be, compute_dtype(precision));
    const std::string peak_text = describe_peaks(peaks, o->peak_tflops);
    ProfilingBackend* profiler = nullptr;
    if (o->profile) {
      auto wrapped = std::make_unique<ProfilingBackend>(std::move(be));
      profiler = wrapped.get();
      be = std::move(wrapped);
    }
    print_bench_header(be.get(), o.get(), peak_text, profiler, on_device, precision_list);
    if (!o->save.empty()) {
      std::error_code ec;
      fs::create_directories(o->save, ec);
      BOTTLE_CHECK(!ec, "--save: cannot create {}: {}", o->save, ec.message());
    }
    const fs::path scratch = fs::temp_directory_path() / fmt::format("bottle-bench-{}", ::getpid());
    fs::create_directories(scratch);
    std::stringstream kinds(o->kinds);
    std::string kind;
    double baseline_ms = 0.0;
    while (std::getline(kinds, kind, ',')) {
      double first_precision_ms = 0.0;
      for (const Precision precision : precision_list) {
        const TrainConfig train_config = kind_config(base, o->model, kind, precision);
        const ModelConfig& config = train_config.model;
        check_before_steps(o.get(), kind, train_config, on_device);
        const int64_t n = o->batch * o->seq;
        const std::vector<int32_t> stream = batch_stream(n, config.vocab_size);
        // The peer's copy of the model after the steps, written while the model lives; the
        // peer runs once bottle's model has given its memory back (on a GPU they share it).
        const bool torch_row =
            o->torch && (on_device ? o->backend == "cuda" : precision == Precision::fp32);
        const fs::path peer_dir = scratch / fmt::format("{}-{}", kind, enum_name(precision));
        nlohmann::ordered_json row;
        const TimedSteps timed =
            run_timed_steps(train_config, be.get(), profiler, o.get(), stream, n, kind, precision,
                            precision_list, torch_row, peer_dir);
        const Spread& t = timed.t;
        const double flops = timed.flops;
        const double gflops = flops / (t.median * 1e6);
        GemmPeak& peak = *peaks.at(precision);
        const std::optional<double> mfu = peak.utilization(gflops);
        // Against --peak-tflops (GFLOP/s over TFLOP/s · 1000); 0 when none is given.
        const double mfu_nominal = o->peak_tflops > 0 ? gflops / (o->peak_tflops * 1e3) : 0.0;
        if (config.bottleneck == BottleneckKind::none && precision == precision_list.front())
          baseline_ms = t.median;
        if (precision == precision_list.front()) first_precision_ms = t.median;
        row = step_row(o.get(), be.get(), kind, precision, precision_list, config, timed, n, gflops,
                       peak, mfu, mfu_nominal, on_device, baseline_ms, first_precision_ms);
        const std::string peer_text =
            torch_row ? peer_columns(o.get(), on_device, precision, peer_dir, timed, row) : "";
        if (profiler) add_profile(row, timed.step_kernels, o->steps);
        if (o->json) {
          fmt::print("{}\n", row.dump());
        } else {
          print_step_line(o.get(), kind, precision, config, t, n, gflops, mfu, mfu_nominal,
                          on_device, timed.host_waits, row, peer_text);
          if (profiler) print_profile(timed.step_kernels, o->steps, t.median);
        }
        std::fflush(stdout);
      }
    }
    fs::remove_all(scratch);
    return 0;
  };
}

}  // namespace bottle
