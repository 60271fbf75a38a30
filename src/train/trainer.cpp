#include "train/trainer.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "comm/process_groups.h"
#include "core/gemm_peak.h"
#include "core/token_shard.h"
#include "model/checkpoint.h"
#include "pipeline/executor.h"
#include "train/adamw.h"
#include "train/checkpoint_store.h"
#include "train/data_loader.h"
#include "train/data_parallel.h"
#include "train/lr_schedule.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/plot.h"
#include "train/stage_work.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

// SIGINT/SIGTERM/SIGHUP (a closed terminal or ssh session) ask the loop to finish its step,
// checkpoint and exit 0; the previous handlers come back when training ends.
class StopSignals {
 public:
  StopSignals() {
    g_stop_signal.store(0);
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGHUP, &sa, &old_hup_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
    sigaction(SIGHUP, &old_hup_, nullptr);
  }
  int requested() const { return g_stop_signal.load(); }

 private:
  struct sigaction old_int_ {
  }, old_term_{}, old_hup_{};
};

std::string in_folder(const std::string& folder, const std::string& path) {
  return fs::path(path).is_absolute() ? path : (fs::path(folder) / path).string();
}

// Test failpoint: BOTTLE_FAILPOINT=kill_rank:R:S kills world rank R (SIGKILL, nothing
// flushed) as it starts step S, to check that a dead rank ends the job instead of hanging it.
void kill_failpoint(int rank, int64_t step) {
  const char* spec = std::getenv("BOTTLE_FAILPOINT");
  int kill_rank = -1;
  long long kill_step = -1;
  if (spec && std::sscanf(spec, "kill_rank:%d:%lld", &kill_rank, &kill_step) == 2 &&
      kill_rank == rank && kill_step == step)
    std::raise(SIGKILL);
}

// The run's outputs (metrics.jsonl, metrics.plot, train_config.toml, the checkpoints and the
// data) must not name one another: writing one would destroy another.
void check_output_paths(const TrainConfig& config, const std::string& config_path,
                        const std::vector<std::string>& data_files) {
  // A path that cannot be resolved (a symlink loop, a file used as a folder) is named here
  // rather than surfacing as a filesystem exception.
  auto resolved = [&](const std::string& key, const std::string& p) {
    std::error_code ec;
    fs::path path = fs::weakly_canonical(fs::absolute(p, ec), ec);
    if (ec) fail("{}: {} ({}) cannot be used: {}", config_path, key, p, ec.message());
    return path;
  };
  const fs::path folder = resolved("checkpoint.folder", config.checkpoint.folder);
  struct Output {
    std::string key;
    fs::path path;
  };
  std::vector<Output> outputs = {
      {"metrics.jsonl",
       resolved("metrics.jsonl", in_folder(config.checkpoint.folder, config.metrics.jsonl))}};
  if (!config.metrics.plot.empty()) {
    const std::string png = in_folder(config.checkpoint.folder, config.metrics.plot);
    outputs.push_back({"metrics.plot", resolved("metrics.plot", png)});
    // plot_metrics writes its data and script beside the image.
    for (const char* suffix : {".train.dat", ".val.dat", ".gp"})
      outputs.push_back({"metrics.plot's scratch file", resolved("metrics.plot", png + suffix)});
  }
  std::vector<Output> others = {
      {"train_config.toml",
       resolved("checkpoint.folder",
                (fs::path(config.checkpoint.folder) / "train_config.toml").string())},
      {"the config file", resolved("the config file", config_path)}};
  for (const std::string& f : data_files) others.push_back({"data", resolved("data", f)});
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Output& out = outputs[i];
    // A device (/dev/full) or FIFO takes no file and may block, or never end when read back.
    std::error_code ec;
    BOTTLE_CHECK(!fs::exists(out.path, ec) || fs::is_regular_file(out.path, ec),
                 "{}: {} ({}) must be a regular file (not a device, FIFO or directory)",
                 config_path, out.key, out.path.string());
    BOTTLE_CHECK(out.path != folder, "{}: {} names checkpoint.folder itself ({})", config_path,
                 out.key, out.path.string());
    // Checkpoints live in step_* (and .tmp-*) folders of checkpoint.folder.
    const fs::path inside = out.path.lexically_relative(folder);
    const std::string first = inside.empty() ? "" : inside.begin()->string();
    BOTTLE_CHECK(first.rfind("step_", 0) != 0 && first.rfind(".tmp-", 0) != 0,
                 "{}: {} ({}) lies inside a checkpoint of checkpoint.folder, which a checkpoint "
                 "would overwrite or remove",
                 config_path, out.key, out.path.string());
    for (size_t j = 0; j < i; ++j)
      BOTTLE_CHECK(out.path != outputs[j].path, "{}: {} and {} name the same file {}", config_path,
                   outputs[j].key, out.key, out.path.string());
    for (const Output& other : others)
      BOTTLE_CHECK(out.path != other.path, "{}: {} names {} ({}), which it would overwrite",
                   config_path, out.key, other.key, out.path.string());
  }
}

// Token ids must fit the model; the error names the data rather than a kernel.
void check_vocabulary(Tensor tokens, int64_t vocab, const std::string& data) {
  for (int64_t i = 0; i < tokens.numel(); ++i)
    BOTTLE_CHECK(tokens.i32()[i] >= 0 && tokens.i32()[i] < vocab,
                 "{}: token id {} is outside the model's vocabulary [0, {}) (model.vocab_size)",
                 data, tokens.i32()[i], vocab);
}

// Mean loss over the first `batches` validation batches, always the same ones.
double evaluate(Backend& be, LlamaModel& model, Communicator* pp, TokenLoader& val, int64_t batches,
                std::vector<Tensor>& inputs, std::vector<Tensor>& targets) {
  val.set_position(LoaderPosition{});
  const PipelineStage& stage = model.stage();
  double total = 0.0;
  for (int64_t i = 0; i < batches; ++i) {
    val.next(inputs[0].i32(), targets[0].i32());
    check_vocabulary(inputs[0], model.config().vocab_size, val.last_file());
    check_vocabulary(targets[0], model.config().vocab_size, val.last_file());
    TrainStageWork work(be, model, 1, inputs, targets, 0.0f);
    run_pipeline(forward_only_schedule(stage.stages, stage.stage, 1), work, pp);
    total += work.loss_sum;
  }
  return reduce_scalar(pp, total, ReduceOp::sum, "pp.eval_loss") / double(batches);
}

// Peak bytes per tag, one entry per world rank: {"weights": [r0, r1, ...], ..., "total": [...]}.
nlohmann::json peak_memory_per_rank(Communicator& world) {
  constexpr size_t kTags = size_t(MemoryTag::count);
  const MemoryStats& stats = MemoryStats::global();
  std::array<size_t, kTags + 1> mine{};
  for (size_t i = 0; i < kTags; ++i) mine[i] = stats.peak(MemoryTag(i));
  mine[kTags] = stats.peak_total();
  const auto ranks = gather_sizes(world, mine);
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i <= kTags; ++i) {
    nlohmann::json per_rank = nlohmann::json::array();
    for (const auto& rank : ranks) per_rank.push_back(rank[i]);
    out[i < kTags ? memory_tag_name(MemoryTag(i)) : "total"] = per_rank;
  }
  return out;
}

}  // namespace

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  const TrainingConfig& tc = config.training;
  BOTTLE_CHECK(!config.data.train.empty(),
               "{}: data.train is not set (a token shard, directory or glob)", options.config_path);
  BOTTLE_CHECK(tc.precision == Precision::fp32,
               "{}: training.precision = \"bf16\" is not available on the cpu backend yet",
               options.config_path);
  // Every rank checks the layout before any work, so a bad one fails everywhere at once.
  Communicator& world = world_communicator();
  ProcessGroups groups = ProcessGroups::create(
      world, {int(config.parallel.tp), int(config.parallel.pp), int(config.parallel.dp)});
  const bool leader = world.rank() == 0;  // writes metrics, plots and checkpoints
  auto be = make_backend("cpu");
  const int64_t B = tc.micro_batch_size, S = tc.seq_len;

  const int dp_size = int(config.parallel.dp);
  const PipelineStage stage{int(config.parallel.pp), groups.pp_rank};
  // The micro-batches of a step (gradient accumulation) go through the pipeline schedule.
  const int micro_batches = int(tc.grad_accum_steps);
  const std::vector<Action> actions =
      pipeline_schedule(config.parallel.schedule, stage.stages, stage.stage, micro_batches);
  const int slots = peak_in_flight(actions);
  const TensorParallel tp{config.parallel.tp_mode, groups.tp.get(), config.parallel.grouping};
  // Before any memory is used: a layout that will not fit is refused on every rank. The
  // parameters alone first: a model far too large would take long to plan exactly.
  const std::string advice =
      "lower training.micro_batch_size or the model's size, set training.recompute, or spread "
      "the model over more ranks (parallel.tp, parallel.pp) and machines";
  check_parameter_memory(config.model, true, config.parallel.tp * config.parallel.pp,
                         config.parallel.zero ? config.parallel.dp : 1, world, options.config_path,
                         advice);
  const MemoryBreakdown plan = plan_rank_memory(config, tp, stage, slots);
  check_memory_limit(config, plan, world, options.config_path);
  check_available_memory(plan, world, options.config_path, advice);
  LlamaModel model(config.model, tp, config.parallel.zero ? dp_size : 1, stage);
  Communicator* pp = groups.pp.get();
  // Tied embeddings: the first and the last stage each hold the table (every pp rank joins
  // the split; the others' group goes unused).
  std::unique_ptr<Communicator> embedding_group;
  if (config.model.tie_embeddings && stage.stages > 1)
    embedding_group =
        pp->split(stage.first() || stage.last() ? 0 : 1, stage.stage, "tied_embedding");
  DataParallel data_parallel(groups.dp.get(), model.parameters(), int(config.parallel.zero));
  AdamW optimizer(model.parameters(), config.adamw(), data_parallel.begin(), data_parallel.end());
  // Each DP rank reads every dp-th window: together they read what one process would.
  TokenLoader loader(config.data.train, B, S, uint64_t(tc.seed), groups.dp_rank, dp_size);
  std::unique_ptr<TokenLoader> val;
  if (!config.data.val.empty()) {
    val = std::make_unique<TokenLoader>(config.data.val, B, S, 0, 0, 1, false);
    // More batches than the split holds would wrap around and count batches twice.
    BOTTLE_CHECK(tc.eval_interval == 0 || uint64_t(tc.eval_batches) <= val->windows_per_epoch(),
                 "{}: key 'training.eval_batches' is {}, but data.val ({}) holds {} batch(es) of "
                 "{} x {} (+1) tokens; lower training.eval_batches",
                 options.config_path, tc.eval_batches, config.data.val, val->windows_per_epoch(), B,
                 S);
  }
  {
    std::vector<std::string> data_files = loader.files();
    if (val) data_files.insert(data_files.end(), val->files().begin(), val->files().end());
    check_output_paths(config, options.config_path, data_files);
  }
  CheckpointStore store(config.checkpoint.folder, int(config.checkpoint.keep));

  int64_t step = 0, last_saved = -1;
  if (options.resume) {
    const auto latest = store.latest();
    const std::vector<std::string> incomplete = store.incomplete();
    BOTTLE_CHECK(
        latest, "--resume: no checkpoint in {} (checkpoint.folder){}", config.checkpoint.folder,
        incomplete.empty() ? std::string()
                           : fmt::format("; {} has no {} (an interrupted or foreign write)",
                                         incomplete.back(), kTrainerStateFile));
    // A newer step directory that is not a complete checkpoint is passed over, openly.
    if (leader)
      for (const std::string& dir : incomplete)
        if (dir > *latest)
          std::printf("skipped %s: it has no %s (an interrupted or foreign write)\n", dir.c_str(),
                      kTrainerStateFile);
    const ModelConfig saved = read_model_config(*latest);
    const std::string diff = model_config_difference(saved, config.model);
    BOTTLE_CHECK(diff.empty(),
                 "--resume: the checkpoint {} holds another model than {} describes ({}: "
                 "checkpoint vs config)",
                 *latest, options.config_path, diff);
    const nlohmann::json state = CheckpointStore::load(*latest, model, optimizer);
    try {
      step = state.at("step").get<int64_t>();
      loader.set_position(state.at("train_position").get<LoaderPosition>());
    } catch (const nlohmann::json::exception& e) {
      fail("{}/{}: {}", *latest, kTrainerStateFile, e.what());
    }
    last_saved = step;
    BOTTLE_CHECK(step <= tc.steps,
                 "--resume: the checkpoint {} is at step {}, past training.steps = {}; set "
                 "training.steps above {} to train further",
                 *latest, step, tc.steps, step);
    if (step == tc.steps) {
      // Nothing to train: no loss, no metrics, no new checkpoint.
      if (leader)
        std::printf(
            "already complete: %s is at step %lld of training.steps = %lld; set training.steps "
            "higher to train further\n",
            latest->c_str(), (long long)step, (long long)tc.steps);
      TrainResult done;
      done.steps_done = step;
      done.already_complete = true;
      done.last_checkpoint = *latest;
      return done;
    }
    if (leader) std::printf("resumed from %s at step %lld\n", latest->c_str(), (long long)step);
  } else if (store.latest()) {
    fail(
        "{} already holds checkpoints (newest {}): continue it with --resume, or choose another "
        "checkpoint.folder",
        config.checkpoint.folder, *store.latest());
  }
  if (!options.resume && !options.init_from.empty()) {
    const ModelConfig saved = read_model_config(options.init_from);
    const std::string diff = model_config_difference(saved, config.model);
    BOTTLE_CHECK(diff.empty(),
                 "--init-from: {} holds another model than {} describes ({}: checkpoint vs config)",
                 options.init_from, options.config_path, diff);
    load_model_weights(model, options.init_from);
  } else if (!options.resume) {
    model.init_weights(uint64_t(tc.seed));
  }
  model.allocate_activations(B, S, slots, tc.recompute);

  LrSchedule schedule{float(config.optimizer.lr), config.lr_scheduler.warmup_steps, tc.steps,
                      enum_name(config.lr_scheduler.decay),
                      float(config.lr_scheduler.min_lr_ratio)};
  std::unique_ptr<MetricsLogger> metrics;
  if (leader) {
    metrics =
        std::make_unique<MetricsLogger>(in_folder(config.checkpoint.folder, config.metrics.jsonl),
                                        config.metrics.log_freq, tc.steps, step, options.resume);
    const fs::path resolved = fs::path(config.checkpoint.folder) / "train_config.toml";
    std::error_code ec;
    fs::create_directories(config.checkpoint.folder, ec);
    BOTTLE_CHECK(!ec, "{}: cannot create checkpoint.folder: {}", config.checkpoint.folder,
                 ec.message());
    std::ofstream out(resolved, std::ios::trunc);
    out << to_toml(config);
    out.close();
    BOTTLE_CHECK(out, "{}: write failed (disk full or read-only?)", resolved.string());
  }
  auto message = [&](const std::string& text) {
    if (metrics) metrics->message(text);
  };
  GemmPeak peak(*be);
  // The probe's matrices are gone: peaks count training alone.
  MemoryStats::global().reset_peaks();
  // The whole job's model FLOPs: every DP replica's micro-batches.
  const double flops_per_step =
      model.flops_per_step(B * S, S) * double(tc.grad_accum_steps) * double(dp_size);
  message(fmt::format(
      "training {} ({} parameters, {} bottleneck) for {} steps of {} tokens on {} rank(s) (tp {} "
      "\"{}\") x {} threads; GEMM peak {:.0f} GFLOP/s per rank; recompute \"{}\"; planned "
      "memory of rank 0: {} ({})",
      options.config_path, config.model.parameter_count(),
      bottleneck_kind_name(config.model.bottleneck), tc.steps, config.tokens_per_step(),
      world.size(), config.parallel.tp, tp_mode_name(config.parallel.tp_mode),
      omp_get_max_threads(), peak.gflops(), recompute_name(tc.recompute),
      format_bytes(plan.total()), describe_memory(plan)));

  Arena batch_arena(MemoryTag::workspace);
  std::vector<Tensor> inputs, targets;  // per micro-batch [B, S]
  for (int m = 0; m < micro_batches; ++m) {
    inputs.push_back(batch_arena.alloc({B, S}, DType::i32));
    targets.push_back(batch_arena.alloc({B, S}, DType::i32));
  }
  auto state_json = [&](int64_t at_step) {
    return nlohmann::json{{"step", at_step},
                          {"optimizer_steps", optimizer.steps_taken()},
                          {"train_position", loader.position()},
                          {"seed", tc.seed},
                          {"config", to_toml(config)}};
  };
  TrainResult result;
  std::vector<double> rates;
  StopSignals signals;
  while (step < tc.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    model.zero_grad(*be);
    for (int m = 0; m < micro_batches; ++m) {
      loader.next(inputs[m].i32(), targets[m].i32());
      check_vocabulary(inputs[m], config.model.vocab_size, loader.last_file());
      check_vocabulary(targets[m], config.model.vocab_size, loader.last_file());
    }
    kill_failpoint(world.rank(), step + 1);
    TrainStageWork work(*be, model, slots, inputs, targets, 1.0f / float(micro_batches));
    run_pipeline(actions, work, pp);
    model.reduce_tied_embedding_grad(embedding_group.get());
    // The loss lives on the last stage; every rank learns it.
    double loss =
        reduce_scalar(pp, work.loss_sum, ReduceOp::sum, "pp.loss") / double(micro_batches);
    data_parallel.reduce_gradients(*be);
    loss = data_parallel.sum(loss, "dp.loss") / dp_size;
    // Each stage holds its own parameters: their squared norms add up over the pipeline.
    double sum_squares = data_parallel.zero()
                             ? data_parallel.sum(model.grad_sum_squares(*be, data_parallel.begin(),
                                                                        data_parallel.end()),
                                                 "dp.grad_norm")
                             : model.grad_sum_squares(*be);
    const double grad_norm =
        std::sqrt(reduce_scalar(pp, sum_squares, ReduceOp::sum, "pp.grad_norm"));
    const float lr = schedule.at(step);
    const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
    if (!finite && tc.on_nonfinite == OnNonfinite::stop)
      fail(
          "step {}: the loss is {} (grad norm {}); stopping (set training.on_nonfinite = \"skip\" "
          "to skip such steps)",
          step + 1, loss, grad_norm);
    if (finite) {
      const float clip = tc.max_norm > 0 && grad_norm > tc.max_norm
                             ? float(tc.max_norm / (grad_norm + 1e-6))
                             : 1.0f;
      optimizer.step(*be, model.parameters(), lr, clip);
      data_parallel.gather_parameters();
    } else {
      message(fmt::format("step {}: loss {}, grad norm {}: not finite; step skipped", step + 1,
                          loss, grad_norm));
    }
    ++step;
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    const double tokens_per_s = double(config.tokens_per_step()) / (ms / 1e3);
    rates.push_back(tokens_per_s);
    // The whole model's FLOPs over the whole job's GEMM peak.
    const std::optional<double> mfu = peak.utilization(flops_per_step / (ms * 1e6) / world.size());
    const nlohmann::json memory = peak_memory_per_rank(world);
    if (metrics)
      metrics->log_step({{"step", step},
                         {"loss", loss},
                         {"lr", lr},
                         {"grad_norm", grad_norm},
                         {"tokens_per_s", tokens_per_s},
                         {"mfu", mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr)},
                         {"peak_bytes", MemoryStats::global().peak_total()},
                         {"activation_bytes", MemoryStats::global().peak(MemoryTag::activations)},
                         {"memory", memory},
                         {"ms", ms},
                         {"skipped", !finite}});
    result.last_loss = loss;
    if (val && tc.eval_interval > 0 && (step % tc.eval_interval == 0 || step == tc.steps)) {
      result.last_val_loss = evaluate(*be, model, pp, *val, tc.eval_batches, inputs, targets);
      if (metrics) metrics->log_eval(step, result.last_val_loss);
    }
    // A signal may reach the ranks at different steps: they agree before acting on it. A
    // failed metrics write (rank 0 only) stops every rank too, after a checkpoint.
    int32_t stop_flags[2] = {signals.requested(), metrics && !metrics->write_error().empty()};
    if (world.size() > 1)
      world.all_reduce(Tensor{stop_flags, {2}, DType::i32}, ReduceOp::max, "train.stop");
    const int32_t stop_signal = stop_flags[0];
    const bool write_failed = stop_flags[1] != 0;
    const bool stop = stop_signal != 0 || write_failed;
    if ((config.checkpoint.interval > 0 && step % config.checkpoint.interval == 0) ||
        step == tc.steps || stop) {
      result.last_checkpoint =
          store.save(model, optimizer, state_json(step), step, groups.dp.get(), &world);
      last_saved = step;
      message(fmt::format("step {}: checkpoint {}", step, result.last_checkpoint));
    }
    if (write_failed)
      fail("{}: cannot write metrics.jsonl ({}); stopped after step {} with checkpoint {}",
           in_folder(config.checkpoint.folder, config.metrics.jsonl),
           metrics ? metrics->write_error() : "on rank 0", step, result.last_checkpoint);
    if (stop) {
      message(fmt::format("stopped by signal {} after step {}; resume with --resume", stop_signal,
                          step));
      result.interrupted = true;
      break;
    }
  }
  if (last_saved != step && step > 0)
    result.last_checkpoint =
        store.save(model, optimizer, state_json(step), step, groups.dp.get(), &world);
  result.steps_done = step;
  if (!rates.empty()) {
    std::nth_element(rates.begin(), rates.begin() + rates.size() / 2, rates.end());
    result.tokens_per_s = rates[rates.size() / 2];
  }
  if (metrics && !config.metrics.plot.empty() && step > 0) {
    const std::string png = in_folder(config.checkpoint.folder, config.metrics.plot);
    plot_metrics(metrics->path(), png);
    message("plot: " + png);
  }
  return result;
}

}  // namespace bottle
