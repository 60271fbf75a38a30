// `bottle bench step`: one training step (forward + backward + clipping + AdamW) timed for each
// model kind, next to the same step in PyTorch run in the same invocation, with achieved GFLOP/s
// and MFU against a GEMM peak measured here and now.
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "apps/torch_peer.h"
#include "core/gemm_peak.h"
#include "core/profiling_backend.h"
#include "core/system_info.h"
#include "core/token_shard.h"
#include "model/checkpoint.h"
#include "train/adamw.h"
#include "train/memory_plan.h"
#include "train/train_config.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}

struct Timing {
  double median = 0, min = 0, max = 0;
};

Timing summarize(std::vector<double> ms) {
  std::sort(ms.begin(), ms.end());
  return {ms[ms.size() / 2], ms.front(), ms.back()};
}

void print_profile(const ProfilingBackend& profiler, int64_t steps) {
  std::vector<std::pair<std::string, KernelTime>> rows(profiler.times().begin(),
                                                       profiler.times().end());
  std::sort(rows.begin(), rows.end(),
            [](const auto& a, const auto& b) { return a.second.ms > b.second.ms; });
  double total = 0.0;
  for (const auto& [name, t] : rows) total += t.ms;
  std::printf("  %-40s %8s %9s %6s %9s\n", "kernel (per step)", "calls", "ms", "%", "GFLOP/s");
  for (const auto& [name, t] : rows)
    std::printf("  %-40s %8.0f %9.2f %5.1f%% %9s\n", name.c_str(), double(t.calls) / double(steps),
                t.ms / double(steps), 100.0 * t.ms / total,
                t.flops > 0 ? fmt::format("{:.0f}", t.flops / (t.ms * 1e6)).c_str() : "");
  std::printf("  %-40s %8s %9.2f\n", "total in kernels", "", total / double(steps));
}

}  // namespace

// What bench step reads of a training configuration; a file's other training-run keys
// (data, checkpoints, the schedule) do not change the step it times.
const CommandKeys kBenchStepKeys{
    "bench step",
    {"model.", "training.micro_batch_size", "training.seq_len", "training.seed",
     "training.max_norm", "optimizer."},
    {"training.steps", "training.eval_interval", "training.eval_batches", "training.on_nonfinite",
     "lr_scheduler.", "data.", "checkpoint.", "metrics."},
    "it times one fp32 training step of one micro-batch on one process, keeping every "
    "activation, per model kind"};

Command add_bench_step_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> overrides;
    ModelConfig model;
    std::string kinds = "none,cola";
    int64_t batch = 8, seq = 256, steps = 10, warmup = 3;
    int threads = 2;
    // What a configuration sets; without one, these fixed settings.
    AdamWConfig adamw = OptimizerConfig{}.adamw();
    float lr = 1e-3f;
    double max_norm = 1.0;
    uint64_t seed = 1234;
    bool torch = true, json = false, profile = false;
  };
  auto o = std::make_shared<Options>();
  o->model.rank = 64;
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
  app.add_option("--steps", o->steps, "timed steps")->check(integer_in(1, INT32_MAX));
  app.add_option("--warmup", o->warmup, "untimed steps first")->check(integer_in(0, INT32_MAX));
  app.add_option("--threads", o->threads, "threads for bottle and PyTorch alike")
      ->check(integer_in(1, kMaxThreads));
  app.add_option("--torch", o->torch, "also time the PyTorch peer (true/false)");
  app.add_flag("--json", o->json, "one JSON object per kind");
  app.add_flag("--profile", o->profile,
               "also print the time per kernel (GEMMs per shape) of the timed steps");
  return [o, config, kv_heads, kinds] {
    omp_set_num_threads(o->threads);
    if (config->count()) {
      ConfigKeysGiven given;
      const TrainConfig c = load_train_config(o->config, o->overrides, &given);
      check_honoured_keys(c, given, o->config, kBenchStepKeys);
      o->adamw = c.adamw();
      o->lr = float(c.optimizer.lr);
      o->max_norm = c.training.max_norm;
      o->seed = uint64_t(c.training.seed);
      o->model = c.model;
      o->batch = c.training.micro_batch_size;
      o->seq = c.training.seq_len;
      if (!kinds->count()) o->kinds = bottleneck_kind_name(c.model.bottleneck);
    } else if (!kv_heads->count()) {
      o->model.num_kv_heads = o->model.num_heads;
    }
    o->model.max_seq_len = std::max(o->model.max_seq_len, o->seq);
    if (config->count())
      check_batch_shape(o->model, o->batch, o->seq, o->config + ": key",
                        "'training.micro_batch_size'", "'training.seq_len'");
    else
      check_batch_shape(o->model, o->batch, o->seq, "bench step:", "--batch", "--seq");
    std::unique_ptr<Backend> be = make_backend("cpu");
    // Measured on the unwrapped backend, so the profile counts the step's kernels alone.
    GemmPeak peak(*be);
    ProfilingBackend* profiler = nullptr;
    if (o->profile) {
      auto wrapped = std::make_unique<ProfilingBackend>(std::move(be));
      profiler = wrapped.get();
      be = std::move(wrapped);
    }
    if (!o->json)
      std::printf(
          "bench step: V=%lld d=%lld d_ff=%lld L=%lld H=%lld s=%lld b=%lld fp32, %d threads; GEMM "
          "peak %.0f GFLOP/s\nCPU: %s\n",
          (long long)o->model.vocab_size, (long long)o->model.hidden_size,
          (long long)o->model.intermediate_size, (long long)o->model.num_layers,
          (long long)o->model.num_heads, (long long)o->seq, (long long)o->batch, o->threads,
          peak.gflops(), cpu_summary().c_str());
    const fs::path scratch = fs::temp_directory_path() / fmt::format("bottle-bench-{}", ::getpid());
    fs::create_directories(scratch);
    std::stringstream kinds(o->kinds);
    std::string kind;
    double baseline_ms = 0.0;
    while (std::getline(kinds, kind, ',')) {
      ModelConfig config = o->model;
      config.bottleneck = parse_bottleneck_kind(kind);
      {
        const std::string what = fmt::format("bench step: the {} model", kind),
                          advice = "lower --batch, --seq or the model's size";
        check_parameter_memory(config, true, 1, 1, world_communicator(), what, advice);
        check_available_memory(plan_model_memory(config, TensorParallel{default_tp_mode(config)},
                                                 o->batch, o->seq, true),
                               world_communicator(), what, advice);
      }
      LlamaModel model(config);
      model.init_weights(o->seed);
      model.allocate_activations(o->batch, o->seq);
      AdamW optimizer(model.parameters(), o->adamw);
      Arena data(MemoryTag::workspace);
      const int64_t n = o->batch * o->seq;
      Tensor tokens = data.alloc({o->batch, o->seq}, DType::i32),
             targets = data.alloc({o->batch, o->seq}, DType::i32);
      std::vector<int32_t> stream(size_t(n + 1));
      for (size_t i = 0; i < stream.size(); ++i)
        stream[i] = int32_t((i * 2654435761u) % uint64_t(config.vocab_size));
      std::copy(stream.begin(), stream.end() - 1, tokens.i32());
      std::copy(stream.begin() + 1, stream.end(), targets.i32());
      std::vector<double> ms;
      float loss = 0.0f;
      for (int64_t step = 0; step < o->warmup + o->steps; ++step) {
        if (profiler && step == o->warmup) profiler->reset();
        const auto t0 = Clock::now();
        model.zero_grad(*be);
        loss = model.forward(*be, tokens, targets);
        model.backward(*be, tokens, targets);
        // Clipping by the global norm, as bottle train does: the same work per step.
        const double norm = std::sqrt(be->sum_squares(model.parameters().grads()));
        optimizer.step(
            *be, model.parameters(), o->lr,
            o->max_norm > 0 && norm > o->max_norm ? float(o->max_norm / (norm + 1e-6)) : 1.0f);
        if (step >= o->warmup) ms.push_back(ms_since(t0));
      }
      const Timing t = summarize(ms);
      const double flops = model.flops_per_step(n, o->seq);
      const double gflops = flops / (t.median * 1e6);
      const std::optional<double> mfu = peak.utilization(gflops);
      if (config.bottleneck == BottleneckKind::none) baseline_ms = t.median;
      nlohmann::ordered_json row{
          {"kind", kind},
          {"rank", config.bottleneck == BottleneckKind::none ? 0 : config.rank_of(ProjectionId::q)},
          {"params", config.parameter_count()},
          {"ms_per_step", t.median},
          {"ms_min", t.min},
          {"ms_max", t.max},
          {"tokens_per_s", double(n) / (t.median / 1e3)},
          {"gflops", gflops},
          {"mfu", mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr)},
          {"gemm_peak_gflops", peak.gflops()},
          {"cpu", cpu_model()},
          {"onednn_isa", onednn_isa()},
          {"loss", loss},
          {"peak_bytes", MemoryStats::global().peak_total()}};
      if (config.bottleneck != BottleneckKind::none && baseline_ms > 0)
        row["speedup_vs_full_rank"] = baseline_ms / t.median;
      if (o->torch) {
        const fs::path dir = scratch / kind;
        save_model(model, dir.string());
        write_token_shard((dir / "tokens.bin").string(), stream);
        const TorchStep torch = run_torch_bench(dir.string(), (dir / "tokens.bin").string(),
                                                o->batch, o->seq, o->steps, o->warmup, o->threads);
        row["torch_ms_per_step"] = torch.ms_median;
        row["torch_ms_min"] = torch.ms_min;
        row["torch_ms_max"] = torch.ms_max;
        row["torch_version"] = torch.version;
        row["torch_blas_core"] = torch.blas_core;
        row["torch_blas_core_source"] = torch.blas_core_source;
        row["speedup_vs_torch"] = torch.ms_median / t.median;
      }
      if (o->json) {
        std::printf("%s\n", row.dump().c_str());
      } else {
        std::printf(
            "%-5s %9lld params  %8.1f ms/step [%.1f-%.1f]  %9.0f tok/s  %6.1f GFLOP/s  MFU %s",
            kind.c_str(), (long long)config.parameter_count(), t.median, t.min, t.max,
            double(n) / (t.median / 1e3), gflops,
            mfu ? fmt::format("{:.1f}%", 100.0 * *mfu).c_str() : "n/a (peak measured while busy)");
        if (row.contains("speedup_vs_full_rank"))
          std::printf("  %.2fx vs full-rank", row["speedup_vs_full_rank"].get<double>());
        if (o->torch)
          std::printf("  | PyTorch %s (OpenBLAS %s) %.1f ms/step [%.1f-%.1f]: bottle %.2fx",
                      row["torch_version"].get<std::string>().c_str(),
                      row["torch_blas_core"].get<std::string>().c_str(),
                      row["torch_ms_per_step"].get<double>(), row["torch_ms_min"].get<double>(),
                      row["torch_ms_max"].get<double>(), row["speedup_vs_torch"].get<double>());
        std::printf("\n");
      }
      if (profiler) print_profile(*profiler, o->steps);
      std::fflush(stdout);
    }
    fs::remove_all(scratch);
    return 0;
  };
}

}  // namespace bottle
