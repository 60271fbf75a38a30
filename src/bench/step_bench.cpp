// `bottle bench step` (bench/step_bench.h): each kind's training step timed beside the
// PyTorch peer's, with GFLOP/s and MFU.
#include "bench/step_bench.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <sstream>

#include "backend/backend_options.h"
#include "backend/gemm_peak.h"
#include "backend/profiling_backend.h"
#include "bench/results.h"
#include "bench/torch_peer.h"
#include "comm/communicator.h"
#include "core/arena.h"
#include "core/error.h"
#include "core/statistics.h"
#include "io/token_shard.h"
#include "model/checkpoint.h"
#include "sys/system_info.h"
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

// The same profile in a kind's row: backend ops (launches) and milliseconds in them per step,
// attention's share, and each op's calls and milliseconds per step (what the GPU window's
// summary reads: scripts/gpu_check.sh).
StepRow::Profile step_profile(const std::map<std::string, KernelTime>& times, int64_t steps) {
  double calls = 0.0, ms = 0.0, attention_ms = 0.0;
  StepRow::Profile p;
  for (const auto& [name, t] : times) {
    calls += double(t.calls);
    ms += t.ms;
    if (name.starts_with("attention")) attention_ms += t.ms;
    p.ops[name] = {double(t.calls) / double(steps), t.ms / double(steps)};
  }
  p.ops_per_step = calls / double(steps);
  p.kernel_ms_per_step = ms / double(steps);
  p.attention_ms_per_step = attention_ms / double(steps);
  return p;
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
    return fmt::format(
        "its first step disagrees with bottle's (loss {:.6g} vs {:.6g}, gradient "
        "norm {:.6g} vs {:.6g})",
        torch.first_loss, first.loss, torch.first_grad_norm, first.grad_norm);
  return {};
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
std::unique_ptr<Backend> open_bench_backend(const BenchStepOptions* o) {
  if (const std::string why = backend_unavailable(o->backend); !why.empty()) {
    if (!o->backend_from_config) fail("bench step: --backend {}: {}", o->backend, why);
    fail("{}: training.backend = \"{}\": {} (choose another with --backend)", o->config_path,
         o->backend, why);
  }
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
                        Precision precision, OptimizerKind optimizer) {
  TrainConfig train_config = bench_step_config(base);
  train_config.training.precision = precision;
  train_config.optimizer.name = optimizer;
  train_config.model = model;
  train_config.model.bottleneck = parse_bottleneck_kind(kind);
  train_config.parallel.tp_mode = &default_tp_layout(train_config.model.shape());
  return train_config;
}

// --optimizers: optimizer.name values, AdamW's first (the others' rows are compared with it);
// empty: the configuration's.
std::vector<OptimizerKind> parse_optimizers(const std::string& list, const TrainConfig& base) {
  if (list.empty()) return {base.optimizer.name};
  std::vector<OptimizerKind> out;
  std::stringstream names(list);
  for (std::string name; std::getline(names, name, ',');) {
    std::optional<OptimizerKind> kind;
    for (const OptimizerKind k : {OptimizerKind::adamw, OptimizerKind::muon})
      if (name == enum_name(k)) kind = k;
    BOTTLE_CHECK(kind, "--optimizers: unknown optimizer '{}' (adamw, muon)", name);
    if (std::find(out.begin(), out.end(), *kind) == out.end()) out.push_back(*kind);
  }
  std::stable_partition(out.begin(), out.end(),
                        [](OptimizerKind k) { return k == OptimizerKind::adamw; });
  return out;
}

// One batch of b rows of s tokens (n in all), stepped on every step: rows of a fixed stream, the
// targets the inputs shifted by one, as a token shard's window gives them.
std::vector<int32_t> batch_stream(int64_t n, int64_t vocab_size) {
  std::vector<int32_t> stream(size_t(n + 1));
  for (size_t i = 0; i < stream.size(); ++i)
    stream[i] = int32_t((i * 2654435761u) % uint64_t(vocab_size));
  return stream;
}

// Refusals before a kind's steps: a --save folder that cannot be written (`saves`: this row's
// model is the one saved), and a host backend's model and step that do not fit the host's
// memory.
void check_before_steps(const BenchStepOptions* o, const std::string& kind,
                        const TrainConfig& train_config, bool on_device, bool saves) {
  const ModelConfig& config = train_config.model;
  // A folder --save cannot write into is refused before any step.
  if (saves) {
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
  Spread optimizer;        // the update inside each step
  StepResult first, last;  // the first step's (the peer's check) and the last timed step's
  std::map<std::string, KernelTime> step_kernels;  // the timed steps' (--profile)
  double host_waits = 0;  // per timed step: the host waiting for the device
  double flops = 0;
};

// The kind's steps on one batch (`stream`, n tokens): the model's copy for the peer, the
// warm-up, then the timed steps; then, while the model lives, its copy for --save when `saves`
// (the first precision's and optimizer's row).
TimedSteps run_timed_steps(const TrainConfig& train_config, Backend* be, ProfilingBackend* profiler,
                           const BenchStepOptions* o, const std::vector<int32_t>& stream, int64_t n,
                           const std::string& kind, bool saves, bool torch_row,
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
  std::vector<double> ms, optimizer_ms;
  int64_t waits_before = 0;  // the backend's host waits when the timed steps start
  for (int64_t step = 0; step < o->warmup + o->steps; ++step) {
    if (step == o->warmup) {
      if (profiler) profiler->reset();
      waits_before = be->host_waits();
    }
    r.last = train_step.step(step);
    if (step == 0) r.first = r.last;
    if (step >= o->warmup) {
      ms.push_back(r.last.seconds * 1e3);
      optimizer_ms.push_back(r.last.optimizer_seconds * 1e3);
    }
  }
  r.optimizer = spread_of(optimizer_ms);
  r.host_waits = double(be->host_waits() - waits_before) / double(o->steps);
  r.t = spread_of(ms);
  // Before the model is copied out for --save and the peer, which is not step work.
  if (profiler) r.step_kernels = profiler->times();
  r.flops = model.flops_per_step(n, o->seq);
  if (saves) {
    const fs::path dir = fs::path(o->save) / kind;
    save_model(model, dir.string());
    write_token_shard((dir / "tokens.bin").string(), stream);
  }
  return r;
}

// A kind's row in one precision, the peer's columns still to come.
StepRow step_row(const BenchStepOptions* o, Backend* be, const std::string& kind,
                 Precision precision, const std::vector<Precision>& precision_list,
                 const ModelConfig& config, const TimedSteps& timed, int64_t n, double gflops,
                 const GemmPeak& peak, std::optional<double> mfu, double mfu_nominal,
                 bool on_device, double baseline_ms, double first_precision_ms) {
  const Spread& t = timed.t;
  StepRow row;
  row.kind = kind;
  row.precision = enum_name(precision);
  row.optimizer_ms = timed.optimizer;
  row.backend = o->backend;
  row.rank = config.bottleneck == BottleneckKind::none ? 0 : config.rank_of(ProjectionId::q);
  row.params = config.parameter_count();
  row.ms = t;
  row.tokens_per_s = double(n) / (t.median / 1e3);
  row.gflops = gflops;
  row.mfu = mfu;
  row.gemm_peak_gflops = peak.gflops();
  if (o->peak_tflops > 0) row.nominal = StepRow::Nominal{mfu_nominal, o->peak_tflops};
  if (o->backend != "cpu") row.device = backend_description(o->backend);
  // Asked again: the backend prepared this shape before the first step, so this is cached.
  row.attention = be->attention_path(o->batch, o->seq, config.num_heads, config.num_kv_heads,
                                     config.head_dim(), compute_dtype(precision));
  row.cpu = cpu_model();
  row.onednn_isa = onednn_isa();
  if (on_device) row.host_waits_per_step = timed.host_waits;
  row.loss = timed.last.loss;
  row.grad_norm = timed.last.grad_norm;
  row.lr = timed.last.lr;
  row.peak_bytes = MemoryStats::global().peak_total();
  if (precision == Precision::bf16) row.bf16_gemm_path = be->bf16_gemm_path();
  if (config.bottleneck != BottleneckKind::none && baseline_ms > 0 &&
      precision == precision_list.front())
    row.speedup_vs_full_rank = baseline_ms / t.median;
  if (precision != precision_list.front())
    row.speedup_vs_precision = {enum_name(precision_list.front()), first_precision_ms / t.median};
  return row;
}

// A kind's row in one precision as text; `peer_text`: the peer's part of the line.
void print_step_line(const BenchStepOptions* o, const std::string& kind, Precision precision,
                     const ModelConfig& config, const Spread& t, int64_t n, double gflops,
                     std::optional<double> mfu, double mfu_nominal, bool on_device,
                     double host_waits, const StepRow& row, const std::string& peer_text) {
  std::string mfu_text = mfu ? fmt::format("{:.1f}%", 100.0 * *mfu)
                             : std::string(on_device ? "n/a (above the measured peak)"
                                                     : "n/a (peak measured while busy)");
  if (o->peak_tflops > 0)
    mfu_text += fmt::format(" of measured GEMM peak, {:.1f}% of {:g} TFLOP/s nominal",
                            100.0 * mfu_nominal, o->peak_tflops);
  fmt::print(
      "{:<5} {:<4} {:<5} {:9} params  {:>8.1f} ms/step [{:.1f}-{:.1f}] (optimizer {:.1f})  "
      "{:>9.0f} "
      "tok/s  {:>6.1f} GFLOP/s  MFU {}",
      kind, enum_name(precision), row.optimizer, config.parameter_count(), t.median, t.min, t.max,
      row.optimizer_ms.median, double(n) / (t.median / 1e3), gflops, mfu_text);
  if (row.step_vs_adamw) fmt::print("  {:.3f}x AdamW's step", *row.step_vs_adamw);
  if (row.speedup_vs_full_rank) fmt::print("  {:.2f}x vs full-rank", *row.speedup_vs_full_rank);
  if (row.speedup_vs_precision)
    fmt::print("  {:.2f}x vs {}", row.speedup_vs_precision->second,
               row.speedup_vs_precision->first);
  fmt::print("{}\n", peer_text);
  if (on_device) fmt::print("      host waits for the device: {:.1f} per step\n", host_waits);
}

// The PyTorch peer's columns of a kind's row, from the model and batch in `peer_dir`, and its
// part of the printed line. On the CPU in fp32 (CPU autocast is not the peer we time against);
// on a GPU on the same GPU, fp32 as fp32 and bf16 as autocast-bf16 over fp32 weights. A GPU
// run goes on when the peer fails (no CUDA PyTorch there, say), saying why.
std::string peer_columns(const BenchStepOptions* o, bool on_device, Precision precision,
                         const fs::path& peer_dir, const TimedSteps& timed, StepRow& row) {
  const Spread& t = timed.t;
  std::string peer_text;
  TorchBenchMode mode;
  mode.device = on_device ? "cuda" : "cpu";
  mode.dtype = precision == Precision::bf16 ? "autocast-bf16" : "f32";
  auto run_peer = [&](bool compile) -> std::optional<TorchStep> {
    mode.compile = compile;
    try {
      return run_torch_bench(peer_dir.string(), (peer_dir / "tokens.bin").string(), o->batch,
                             o->seq, o->steps, o->warmup, o->threads, mode);
    } catch (const Error& e) {
      if (!on_device && !compile) throw;
      const std::string what = e.what();
      const std::string first_line = what.substr(0, what.find('\n'));
      if (compile)
        row.compile_failure = StepRow::CompileFailure{first_line, /*raised=*/true};
      else
        row.torch_error = first_line;
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
    StepRow::Peer& p = row.peer.emplace();
    p.ms = {torch->ms_median, torch->ms_min, torch->ms_max};
    p.version = torch->version;
    p.blas_core = torch->blas_core;
    p.blas_core_source = torch->blas_core_source;
    p.blas_core_pinned = torch->blas_core_pinned;
    if (!blas_fallback.empty()) p.blas_fallback = blas_fallback;
    p.first_loss = torch->first_loss;
    p.first_grad_norm = torch->first_grad_norm;
    p.bottle_first_loss = timed.first.loss;
    p.bottle_first_grad_norm = timed.first.grad_norm;
    p.device = torch->device;
    p.dtype = torch->dtype;
    p.attention = torch->attention;
    if (!torch->gpu.empty()) p.gpu = torch->gpu;
    p.speedup_vs_torch = torch->ms_median / t.median;
    const std::string kernels =
        torch->blas_core_pinned.empty()
            ? torch->blas_core
            : fmt::format("{}, pinned {}", torch->blas_core, torch->blas_core_pinned);
    peer_text += on_device ? fmt::format(
                                 "  | PyTorch {} eager ({}, {}) {:.1f} ms/step "
                                 "[{:.1f}-{:.1f}]: bottle {:.2f}x",
                                 torch->version, torch->dtype, torch->attention, torch->ms_median,
                                 torch->ms_min, torch->ms_max, torch->ms_median / t.median)
                           : fmt::format(
                                 "  | PyTorch {} (OpenBLAS {}) {:.1f} ms/step "
                                 "[{:.1f}-{:.1f}]: bottle {:.2f}x",
                                 torch->version, kernels, torch->ms_median, torch->ms_min,
                                 torch->ms_max, torch->ms_median / t.median);
    if (!blas_fallback.empty()) peer_text += fmt::format(" ({})", blas_fallback);
  } else {
    peer_text += fmt::format("  | PyTorch: {}", row.torch_error.value_or(""));
  }
  if (o->torch_compile) {
    const std::optional<TorchStep> compiled = run_peer(true);
    if (compiled && !compiled->compile_failed) {
      row.compiled = StepRow::Compiled{{compiled->ms_median, compiled->ms_min, compiled->ms_max},
                                       compiled->ms_median / t.median};
      peer_text += fmt::format(
          "  | torch.compile {:.1f} ms/step [{:.1f}-{:.1f}]: bottle "
          "{:.2f}x",
          compiled->ms_median, compiled->ms_min, compiled->ms_max, compiled->ms_median / t.median);
    } else {
      if (compiled)
        row.compile_failure = StepRow::CompileFailure{compiled->compile_error, /*raised=*/false};
      peer_text += fmt::format("  | torch.compile failed: {}", row.compile_failure->error);
    }
  }
  fs::remove_all(peer_dir);
  fs::remove_all(peer_dir);
  return peer_text;
}

}  // namespace

void run_bench_step(const TrainConfig& base, BenchStepOptions options) {
  BenchStepOptions* o = &options;
  omp_set_num_threads(o->threads);
  const std::vector<Precision> precision_list = parse_precisions(o->precisions);
  std::unique_ptr<Backend> be = open_bench_backend(o);
  print_attention_paths(be.get(), o, precision_list);
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
  print_bench_header(be.get(), o, peak_text, profiler, on_device, precision_list);
  if (!o->save.empty()) {
    std::error_code ec;
    fs::create_directories(o->save, ec);
    BOTTLE_CHECK(!ec, "--save: cannot create {}: {}", o->save, ec.message());
  }
  const fs::path scratch = fs::temp_directory_path() / fmt::format("bottle-bench-{}", ::getpid());
  fs::create_directories(scratch);
  const std::vector<OptimizerKind> optimizers = parse_optimizers(o->optimizers, base);
  std::stringstream kinds(o->kinds);
  std::string kind;
  // Per optimizer: the full-rank step (the first precision's) and a kind's first precision's.
  std::map<OptimizerKind, double> baseline_ms;
  while (std::getline(kinds, kind, ',')) {
    std::map<OptimizerKind, double> first_precision_ms;
    for (const Precision precision : precision_list) {
      double adamw_ms = 0.0;  // this kind's and precision's AdamW step, when it was timed first
      for (const OptimizerKind optimizer : optimizers) {
        const TrainConfig train_config = kind_config(base, o->model, kind, precision, optimizer);
        const ModelConfig& config = train_config.model;
        // --save writes each kind's model once: its first precision's and optimizer's.
        const bool saves = !o->save.empty() && precision == precision_list.front() &&
                           optimizer == optimizers.front();
        check_before_steps(o, kind, train_config, on_device, saves);
        const int64_t n = o->batch * o->seq;
        const std::vector<int32_t> stream = batch_stream(n, config.vocab_size);
        // The peer's copy of the model after the steps, written while the model lives; the
        // peer runs once bottle's model has given its memory back (on a GPU they share it).
        // The peer steps with AdamW: it runs beside AdamW's rows.
        const bool torch_row = o->torch && optimizer == OptimizerKind::adamw &&
                               (on_device ? o->backend == "cuda" : precision == Precision::fp32);
        const fs::path peer_dir = scratch / fmt::format("{}-{}", kind, enum_name(precision));
        const TimedSteps timed = run_timed_steps(train_config, be.get(), profiler, o, stream, n,
                                                 kind, saves, torch_row, peer_dir);
        const Spread& t = timed.t;
        const double flops = timed.flops;
        const double gflops = flops / (t.median * 1e6);
        GemmPeak& peak = *peaks.at(precision);
        const std::optional<double> mfu = peak.utilization(gflops);
        // Against --peak-tflops (GFLOP/s over TFLOP/s · 1000); 0 when none is given.
        const double mfu_nominal = o->peak_tflops > 0 ? gflops / (o->peak_tflops * 1e3) : 0.0;
        if (config.bottleneck == BottleneckKind::none && precision == precision_list.front())
          baseline_ms[optimizer] = t.median;
        if (precision == precision_list.front()) first_precision_ms[optimizer] = t.median;
        StepRow row = step_row(o, be.get(), kind, precision, precision_list, config, timed, n,
                               gflops, peak, mfu, mfu_nominal, on_device, baseline_ms[optimizer],
                               first_precision_ms[optimizer]);
        row.optimizer = enum_name(optimizer);
        if (optimizer == OptimizerKind::adamw)
          adamw_ms = t.median;
        else if (adamw_ms > 0)
          row.step_vs_adamw = t.median / adamw_ms;
        const std::string peer_text =
            torch_row ? peer_columns(o, on_device, precision, peer_dir, timed, row) : "";
        if (profiler) row.profile = step_profile(timed.step_kernels, o->steps);
        if (o->json) {
          fmt::print("{}\n", to_json(row).dump());
        } else {
          print_step_line(o, kind, precision, config, t, n, gflops, mfu, mfu_nominal, on_device,
                          timed.host_waits, row, peer_text);
          if (profiler) print_profile(timed.step_kernels, o->steps, t.median);
        }
        std::fflush(stdout);
      }
    }
  }
  fs::remove_all(scratch);
}

}  // namespace bottle
