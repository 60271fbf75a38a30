#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "backend/gemm_peak.h"
#include "comm/process_groups.h"
#include "core/statistics.h"
#include "data/byte_tokenizer.h"
#include "data/shard_meta.h"
#include "io/token_shard.h"
#include "model/checkpoint.h"
#include "parallel/tp_block.h"
#include "sys/stop_signals.h"
#include "sys/system_info.h"
#include "train/checkpoint_store.h"
#include "train/data_files.h"
#include "train/data_loader.h"
#include "train/data_mixture.h"
#include "train/folder_lock.h"
#include "train/job_agreement.h"
#include "train/memory_plan.h"
#include "train/metrics.h"
#include "train/plot.h"
#include "train/resume_check.h"
#include "train/run_guards.h"
#include "train/run_tokenizer.h"
#include "train/shard_record.h"
#include "train/train_step.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// Test failpoint: BOTTLE_FAILPOINT=kill_rank:R:S kills world rank R (SIGKILL, nothing
// flushed) as it starts step S, to check that a dead rank ends the job instead of hanging it.
// BOTTLE_FAILPOINT=internal_error_at_step:S fails an internal check as step S starts, to show
// that an internal error in the middle of a run first saves the steps trained before it.
// BOTTLE_FAILPOINT=nonfinite_weight_at_step:S does the same after writing +inf into the last
// parameter's first element, whose loss the run has not seen: the save on the error path must
// find it in the weights themselves.
void kill_failpoint(int rank, int64_t step, const ParameterStore& params) {
  const char* spec = std::getenv("BOTTLE_FAILPOINT");
  int kill_rank = -1;
  long long kill_step = -1, error_step = -1;
  if (spec && std::sscanf(spec, "kill_rank:%d:%lld", &kill_rank, &kill_step) == 2 &&
      kill_rank == rank && kill_step == step)
    std::raise(SIGKILL);
  if (spec && std::sscanf(spec, "nonfinite_weight_at_step:%lld", &error_step) == 1 &&
      error_step == step) {
    const float inf = std::numeric_limits<float>::infinity();
    params.backend().from_host(params.at(params.specs().size() - 1).value.view(0, {1}), &inf);
  }
  if (spec && (std::sscanf(spec, "internal_error_at_step:%lld", &error_step) == 1 ||
               std::sscanf(spec, "nonfinite_weight_at_step:%lld", &error_step) == 1))
    BOTTLE_ASSERT(error_step != step, "BOTTLE_FAILPOINT={} at step {}", spec, step);
}

// Bytes per tag, one entry per world rank: {"weights": [r0, r1, ...], ..., "total": [...]}, of
// this rank's `bytes` per tag and `total`.
nlohmann::json memory_per_rank(Communicator& world, const MemoryBreakdown& bytes, size_t total) {
  constexpr size_t kTags = size_t(MemoryTag::count);
  std::array<size_t, kTags + 1> mine{};
  for (size_t i = 0; i < kTags; ++i) mine[i] = bytes.bytes[i];
  mine[kTags] = total;
  const auto ranks = gather_sizes(world, mine);
  nlohmann::json out = nlohmann::json::object();
  for (size_t i = 0; i <= kTags; ++i) {
    nlohmann::json per_rank = nlohmann::json::array();
    for (const auto& rank : ranks) per_rank.push_back(rank[i]);
    out[i < kTags ? memory_tag_name(MemoryTag(i)) : "total"] = per_rank;
  }
  return out;
}

// The peaks so far, per tag and rank.
nlohmann::json peak_memory_per_rank(Communicator& world) {
  const MemoryStats& stats = MemoryStats::global();
  MemoryBreakdown peaks;
  for (size_t i = 0; i < size_t(MemoryTag::count); ++i) peaks.bytes[i] = stats.peak(MemoryTag(i));
  return memory_per_rank(world, peaks, stats.peak_total());
}

// What every rank learns at the end of a step: a stop signal or a failed metrics write on
// some rank (the ranks agree before acting on either).
struct StopRequest {
  int32_t signal = 0;         // the signal that asked to stop, 0: none
  bool write_failed = false;  // rank 0 could not write metrics.jsonl
  bool any() const { return signal != 0 || write_failed; }
};

// One `bottle train` run: setup (layout, memory, model, data, outputs), the start (resume,
// --init-from or a fresh initialisation), then per step the batch, TrainStep's optimizer
// step, logging, evaluation, the stop agreement and checkpoints.
class Trainer {
 public:
  // Everything that can be refused before the first step is refused here, on every rank.
  Trainer(const TrainConfig& config, const TrainOptions& options);

  // Resumes, or loads --init-from, or initialises the weights; then allocates the
  // activations and opens the logs. Returns the result at once when --resume finds the run
  // complete: nothing is trained, logged or written then.
  std::optional<TrainResult> start();
  // The steps from the current one to training.steps, or to a stop (`signals`, installed
  // before the setup, may already hold one).
  TrainResult run(StopRequests& signals);

 private:
  void set_up_model();
  void lock_outside_writers();
  void open_data();
  std::optional<TrainResult> resume();
  void open_logs();

  TrainResult run_steps(StopRequests& signals);
  void save_before_failing(const std::string& what);
  std::string first_nonfinite_tensor();
  std::string newest_checkpoint() const;

  void read_batch();
  std::map<std::string, CommCounter> comm_totals() const;
  void log_step(const StepResult& r, double ms,
                const std::map<std::string, CommCounter>& comm_before);
  bool eval_due() const;
  double evaluate();
  StopRequest agree_on_stop(const StopRequests& signals);
  bool checkpoint_due() const;
  // `wait`: an asynchronous save (checkpoint.async) is published before it returns.
  std::string save_checkpoint(bool wait = false);
  void check_folder_held(const std::string& before);
  std::string folder_lost(const std::string& before);
  void finish(TrainResult& result);

  void message(const std::string& text) {
    if (metrics_) metrics_->message(text);
  }
  // What `make` returns; under training.attention = "cudnn" its failure (no cuDNN, a shape
  // or precision cuDNN refuses) names the key.
  template <typename F>
  auto attention_setting(F make) -> decltype(make()) {
    try {
      return make();
    } catch (const Error& e) {
      if (config_.training.attention != AttentionChoice::cudnn) throw;
      fail("{}: training.attention = \"cudnn\": {}", options_.config_path, e.what());
    }
  }
  TrainerState trainer_state() const {
    return {.step = step_,
            .optimizer_steps = train_step_->optimizer().steps_taken(),
            .train_position = loader_->position(),
            .seed = config_.training.seed,
            .data_shards = shards_,
            .metrics_lines = metrics_ ? metrics_->step_lines() : std::vector<std::string>(),
            .config = to_toml(config_)};
  }

  const TrainConfig& config_;
  const TrainingConfig& tc_;
  const TrainOptions& options_;
  Communicator& world_;
  ProcessGroups groups_;
  bool leader_ = false;  // writes metrics, plots and checkpoints
  std::unique_ptr<Backend> be_;
  std::string attention_path_;    // which attention kernels run, and why (the run's first line)
  MemoryBreakdown plan_;          // this rank's planned footprint
  nlohmann::json plan_per_rank_;  // every rank's, per tag: metrics.jsonl's "memory_plan"
  std::unique_ptr<TrainStep> train_step_;
  std::unique_ptr<DataMixture> loader_;     // data.train's sources
  std::vector<SourceRecord> shards_;        // their shards as the run opened them
  std::vector<std::string> resumed_lines_;  // the resumed checkpoint's lines of metrics.jsonl
  std::unique_ptr<TokenLoader> val_;
  std::unique_ptr<FolderLock> lock_;  // rank 0: checkpoint.folder is this run's alone
  std::vector<std::unique_ptr<FolderLock>> writer_locks_;  // rank 0: its outputs outside it
  std::unique_ptr<CheckpointStore> store_;
  std::unique_ptr<Tokenizer> tokenizer_;    // null for byte-level data
  std::unique_ptr<MetricsLogger> metrics_;  // rank 0
  std::unique_ptr<GemmPeak> peak_;
  double flops_per_step_ = 0.0;  // the whole job's model FLOPs per step
  int64_t step_ = 0, last_saved_ = -1;
  bool folder_lost_ = false;   // checkpoint.folder is no longer the run's: nothing is saved
  std::vector<double> rates_;  // tokens/s per step
};

Trainer::Trainer(const TrainConfig& config, const TrainOptions& options)
    : config_(config), tc_(config.training), options_(options), world_(world_communicator()) {
  // Every group is split from the world and inherits its timeout, the configuration check's
  // collective included.
  world_.set_timeout(std::chrono::seconds(config.parallel.comm_timeout));
  // First of all, before any collective whose shape depends on a setting: ranks given
  // different configurations would otherwise hang or exchange buffers of different sizes.
  if (world_.size() > 1)
    check_same_configuration(world_, job_description(config, options), options.config_path);
  BOTTLE_CHECK(!config.data.train.empty(),
               "{}: data.train is not set (a token shard, directory or glob)", options.config_path);
  // The backend first: NCCL groups are built on its GPU and stream. Every rank of a job runs
  // the same backend, so a machine without one fails on every rank alike.
  const char* backend = enum_name(config.training.backend);
  if (std::string why = backend_unavailable(backend); !why.empty())
    fail("{}: training.backend = \"{}\": {}", options.config_path, backend, why);
  be_ = attention_setting([&] { return make_backend(backend, {config.training.attention}); });
  // Every rank checks the layout before any work, so a bad one fails everywhere at once.
  groups_ = ProcessGroups::create(
      world_, {int(config.parallel.tp), int(config.parallel.pp), int(config.parallel.dp)},
      GroupTransport{comm_name(config.parallel.comm, config.training.backend), be_.get()});
  leader_ = world_.rank() == 0;
  set_up_model();
  // Which attention runs, asked once the model's activations exist: the cuda backend builds
  // cuDNN's graphs for the run's shape here, before the first step (rank 0 prints the answer).
  const BlockDims dims =
      config.parallel.tp_mode->block_dims(config.model.shape(), int(config.parallel.tp));
  attention_path_ = attention_setting([&] {
    return be_->attention_path(tc_.micro_batch_size, tc_.seq_len, dims.heads, dims.kv_heads,
                               dims.head_dim, compute_dtype(tc_.precision));
  });
  open_data();
  store_ = std::make_unique<CheckpointStore>(config.checkpoint.folder, int(config.checkpoint.keep));
  // Rank 0 writes the folder, so rank 0 locks it; the others fail with its message.
  run_on_root_or_fail_together(world_, 0, [&] {
    lock_ = std::make_unique<FolderLock>(config.checkpoint.folder);
    lock_outside_writers();
  });
  // Within a save too (check_folder_held checks before and after it, on every rank).
  store_->set_folder_guard([this] {
    if (const std::string lost = folder_lost(fmt::format("saving step {}", step_)); !lost.empty())
      fail("{}", lost);
  });
  // The tokenizer goes into the run's folder and every checkpoint, so that each is a
  // self-contained model for sample, eval and transformers.
  tokenizer_ = find_run_tokenizer(config.data.tokenizer, loader_->files(), config.model.vocab_size,
                                  options.config_path);
  // Without one, a vocabulary that holds every byte is byte-level text (prepare's default),
  // whose tokenizer files let transformers read the checkpoints too.
  if (!tokenizer_ && config.model.vocab_size >= kByteVocabSize) tokenizer_ = make_byte_tokenizer();
  check_tokenizer_matches_shards(tokenizer_.get(), loader_->files(), config, options.config_path);
  store_->set_tokenizer(tokenizer_.get());
}

// metrics.jsonl and the TensorBoard directory may lie outside checkpoint.folder (absolute
// paths), beyond the folder's lock: each takes a lock of its own (FolderLock's, its file
// removed when the run ends), so that two runs never tear one file's lines or mix their event
// files in one directory.
void Trainer::lock_outside_writers() {
  std::error_code ec;
  const fs::path folder = fs::weakly_canonical(fs::absolute(config_.checkpoint.folder), ec);
  auto outside = [&](const fs::path& path) {
    const fs::path inside = fs::weakly_canonical(fs::absolute(path), ec).lexically_relative(folder);
    return inside.empty() || *inside.begin() == "..";
  };
  auto make_directory = [&](const fs::path& dir, const char* key) {
    fs::create_directories(dir, ec);
    BOTTLE_CHECK(!ec, "{}: cannot create the directory of {}: {}", dir.string(), key, ec.message());
  };
  // A file is locked by .NAME.lock beside it.
  auto lock_file = [&](const fs::path& file, const char* key, const char* why) {
    make_directory(file.parent_path(), key);
    writer_locks_.push_back(std::make_unique<FolderLock>(
        (file.parent_path() / fmt::format(".{}.lock", file.filename().string())).string(),
        LockSubject{key, file.string(), "bottle train", why, true}));
  };
  const fs::path jsonl = in_folder(config_.checkpoint.folder, config_.metrics.jsonl);
  if (outside(jsonl)) lock_file(jsonl, "metrics.jsonl", "two runs writing it would tear its lines");
  if (!config_.metrics.plot.empty()) {
    const fs::path plot = in_folder(config_.checkpoint.folder, config_.metrics.plot);
    if (outside(plot))
      lock_file(plot, "metrics.plot", "two runs drawing it would replace each other's curve");
  }
  if (config_.metrics.tensorboard.empty()) return;
  const fs::path events = in_folder(config_.checkpoint.folder, config_.metrics.tensorboard);
  if (outside(events)) {
    make_directory(events, "metrics.tensorboard");
    writer_locks_.push_back(std::make_unique<FolderLock>(
        (events / kFolderLockFile).string(),
        LockSubject{"metrics.tensorboard", events.string(), "bottle train",
                    "two runs writing into it would mix their event files", true}));
  }
}

// The layout's memory is checked before any is used; then the step's model, optimizer and
// buffers.
void Trainer::set_up_model() {
  const PipelineStage stage{int(config_.parallel.pp), groups_.pp_rank};
  const TensorParallel tp = tensor_parallel_of(config_, groups_.tp.get());
  // The parameters alone first: a model far too large would take long to plan exactly.
  const std::string advice =
      "lower training.micro_batch_size or the model's size, set training.recompute, or spread "
      "the model over more ranks (parallel.tp, parallel.pp) and machines";
  const bool on_device = be_->device() != Device::cpu;
  // The host's memory holds a host backend's model; a device's is checked against its own.
  // ZeRO shards the moments (1), the gradients too (2), everything (3) over the DP ranks.
  const int64_t dp = config_.parallel.dp, zero = config_.parallel.zero;
  if (!on_device)
    check_parameter_memory(
        config_.model, true, config_.parallel.tp * config_.parallel.pp * (zero >= 3 ? dp : 1),
        zero == 1 || zero == 2 ? dp : 1, zero == 2 ? dp : 1, world_, options_.config_path, advice);
  // The backend's own scratch is part of the plan: the attention's workspace (cuDNN's backward
  // on a GPU: up to B·H·S²·2 bytes), so that a shape it cannot hold fails here, naming it, not
  // in the first step, and the other kernels' (the cpu backend's bf16 slabs, norm partials and
  // widened GEMM operands).
  const KernelScratch scratch = plan_kernel_scratch(config_, tp.rank(), stage, *be_);
  plan_ = plan_rank_memory(config_, tp, stage, pipeline_slots(config_, stage.stage),
                           scratch.attention, scratch.other);
  check_memory_limit(config_, plan_, world_, options_.config_path);
  plan_per_rank_ = memory_per_rank(world_, plan_, plan_.total());
  if (!on_device) {
    check_available_memory(plan_, world_, options_.config_path, advice);
  } else {
    // Each rank against its GPU's free memory (ranks sharing a GPU under parallel.comm =
    // "mpi" each see what the others have not taken yet).
    const size_t free = be_->device_memory_free();
    const double short_ranks =
        reduce_scalar(&world_, plan_.total() > free ? 1.0 : 0.0, ReduceOp::sum, "memory.check");
    const std::string attention_advice =
        plan_.attention ? fmt::format(
                              "; cuDNN's attention backward takes {} of it (shorter "
                              "sequences or micro-batches need less, training.attention "
                              "= \"own\" none)",
                              format_bytes(plan_.attention))
                        : std::string();
    if (plan_.total() > free)
      fail("{}: the planned memory of this rank is {} ({}), but its GPU has only {} free; {}{}",
           options_.config_path, format_bytes(plan_.total()), describe_memory(plan_),
           format_bytes(free), advice, attention_advice);
    if (short_ranks > 0)
      fail("{}: {:.0f} rank(s) plan more memory than their GPU has free; {}", options_.config_path,
           short_ranks, advice);
  }
  train_step_ = std::make_unique<TrainStep>(config_, *be_, tp, groups_.pp.get(), groups_.dp.get());
}

// The training and validation data, and the outputs, which must not name one another.
void Trainer::open_data() {
  const int64_t B = tc_.micro_batch_size, S = tc_.seq_len;
  // Each DP rank reads every dp-th window: together they read what one process would.
  // A split that cannot be opened is named by its key; a missing validation split also says
  // how to train without one (prepare --val-fraction 0 writes none).
  auto open_split = [&](const char* key, auto open) {
    try {
      return open();
    } catch (const Error& e) {
      const bool val = std::string_view(key) == "data.val";
      fail("{}: key '{}': {}{}", options_.config_path, key, e.what(),
           val ? "; remove data.val (or set it to \"\") to train without a validation split" : "");
    }
  };
  loader_ = open_split("data.train", [&] {
    return std::make_unique<DataMixture>(config_.data.train, config_.data.weights, B, S,
                                         uint64_t(tc_.seed), groups_.dp_rank,
                                         int(config_.parallel.dp));
  });
  shards_ = open_split("data.train", [&] { return record_shards(*loader_); });
  if (!config_.data.val.empty()) {
    val_ = open_split("data.val", [&] {
      return std::make_unique<TokenLoader>(config_.data.val, B, S, uint64_t(0), 0, 1, false);
    });
    // More batches than the split holds would wrap around and count batches twice.
    BOTTLE_CHECK(tc_.eval_interval == 0 || uint64_t(tc_.eval_batches) <= val_->windows_per_epoch(),
                 "{}: key 'training.eval_batches' is {}, but data.val ({}) holds {} batch(es) of "
                 "{} x {} (+1) tokens; lower training.eval_batches",
                 options_.config_path, tc_.eval_batches, config_.data.val,
                 val_->windows_per_epoch(), B, S);
  }
  // Validation shards that are also trained on measure memory, not generalisation: allowed
  // (a smoke test may want it), but said.
  if (val_ && leader_) {
    std::set<fs::path> trained;
    std::error_code ec;
    for (const std::string& f : loader_->files()) trained.insert(fs::weakly_canonical(f, ec));
    int64_t shared = 0;
    std::string first;
    for (const std::string& f : val_->files())
      if (trained.count(fs::weakly_canonical(f, ec)) && shared++ == 0) first = f;
    if (shared > 0)
      fmt::print(stderr,
                 "warning: {} of data.val's {} shard(s) ({}{}) are also in data.train: the "
                 "validation loss is measured on data the run trains on\n",
                 shared, val_->files().size(), first, shared > 1 ? ", ..." : "");
  }
  std::vector<std::string> data_files = loader_->files();
  if (val_) data_files.insert(data_files.end(), val_->files().begin(), val_->files().end());
  check_output_paths(config_, options_.config_path, data_files, options_.init_from);
}

std::optional<TrainResult> Trainer::start() {
  // A folder named like a step that the run did not write would be resumed from, replaced or
  // pruned: refused before anything is read or written.
  store_->check_no_foreign_steps();
  if (options_.resume) {
    if (std::optional<TrainResult> done = resume()) return done;
  } else if (store_->latest()) {
    fail(
        "{} already holds checkpoints (newest {}): continue it with --resume, or choose another "
        "checkpoint.folder",
        config_.checkpoint.folder, *store_->latest());
  } else if (!options_.init_from.empty()) {
    const ModelConfig saved = read_model_config(options_.init_from);
    const std::string diff = model_config_difference(saved, config_.model);
    BOTTLE_CHECK(diff.empty(),
                 "--init-from: {} holds another model than {} describes ({}: checkpoint vs config)",
                 options_.init_from, options_.config_path, diff);
    checkpoint_tokenizer(options_.init_from, saved);
    load_model_weights(train_step_->model(), options_.init_from);
  } else {
    train_step_->model().init_weights(uint64_t(tc_.seed));
  }
  train_step_->allocate_activations();
  open_logs();
  return std::nullopt;
}

// --resume: the newest complete checkpoint's weights, moments, step and data position.
std::optional<TrainResult> Trainer::resume() {
  const auto latest = store_->latest();
  const std::vector<std::string> incomplete = store_->incomplete();
  const std::vector<int64_t> interrupted = store_->interrupted_saves();
  BOTTLE_CHECK(
      latest, "--resume: no checkpoint in {} (checkpoint.folder){}{}", config_.checkpoint.folder,
      incomplete.empty() ? std::string()
                         : fmt::format("; {} has no {} (an interrupted or foreign write)",
                                       incomplete.back(), kTrainerStateFile),
      interrupted.empty() ? std::string()
                          : fmt::format("; the save of step {} did not complete (the process ended "
                                        "while writing it)",
                                        interrupted.back()));
  // A save that a killed process left unfinished (a launcher's kill after a stop signal) is
  // said, with the checkpoint resumed from instead.
  if (leader_)
    for (const int64_t step : interrupted)
      fmt::print(
          "the save of step {} did not complete (the process ended while writing it); "
          "resuming from {}\n",
          step, *latest);
  // A newer step directory that is not a complete checkpoint is passed over, openly.
  if (leader_)
    for (const std::string& dir : incomplete)
      if (CheckpointStore::step_of(dir) > CheckpointStore::step_of(*latest))
        fmt::print("skipped {}: it has no {} (an interrupted or foreign write)\n", dir,
                   kTrainerStateFile);
  const ModelConfig saved = read_model_config(*latest);
  const std::string diff = model_config_difference(saved, config_.model);
  BOTTLE_CHECK(diff.empty(),
               "--resume: the checkpoint {} holds another model than {} describes ({}: "
               "checkpoint vs config)",
               *latest, options_.config_path, diff);
  const std::unique_ptr<Tokenizer> saved_tokenizer = checkpoint_tokenizer(*latest, saved);
  const TrainerState state = read_trainer_state(*latest);
  check_continues_the_run(
      state, *latest, saved_tokenizer.get(),
      ResumingRun{config_, options_.config_path, shards_, tokenizer_.get(), leader_});
  CheckpointStore::load(*latest, train_step_->model(), train_step_->optimizer());
  step_ = state.step;
  loader_->set_position(state.train_position);
  resumed_lines_ = state.metrics_lines;
  last_saved_ = step_;
  BOTTLE_CHECK(step_ <= tc_.steps,
               "--resume: the checkpoint {} is at step {}, past training.steps = {}; set "
               "training.steps above {} to train further",
               *latest, step_, tc_.steps, step_);
  if (step_ == tc_.steps) {
    // Nothing to train: no loss, no metrics, no new checkpoint.
    if (leader_)
      fmt::print(
          "already complete: {} is at step {} of training.steps = {}; set training.steps "
          "higher to train further\n",
          *latest, step_, tc_.steps);
    TrainResult done;
    done.steps_done = step_;
    done.already_complete = true;
    done.last_checkpoint = *latest;
    return done;
  }
  if (leader_) fmt::print("resumed from {} at step {}\n", *latest, step_);
  return std::nullopt;
}

// metrics.jsonl and the resolved train_config.toml (rank 0), the GEMM peak MFU is measured
// against, and the run's first line.
void Trainer::open_logs() {
  if (leader_) {
    metrics_ = std::make_unique<MetricsLogger>(
        in_folder(config_.checkpoint.folder, config_.metrics.jsonl), config_.metrics.log_freq,
        tc_.steps, step_, options_.resume,
        config_.metrics.tensorboard.empty()
            ? std::string()
            : in_folder(config_.checkpoint.folder, config_.metrics.tensorboard),
        resumed_lines_);
    const fs::path resolved = fs::path(config_.checkpoint.folder) / "train_config.toml";
    std::error_code ec;
    fs::create_directories(config_.checkpoint.folder, ec);
    BOTTLE_CHECK(!ec, "{}: cannot create checkpoint.folder: {}", config_.checkpoint.folder,
                 ec.message());
    std::ofstream out(resolved, std::ios::trunc);
    out << to_toml(config_);
    out.close();
    BOTTLE_CHECK(out, "{}: write failed (disk full or read-only?)", resolved.string());
    if (tokenizer_) tokenizer_->save(config_.checkpoint.folder);
  }
  peak_ = std::make_unique<GemmPeak>(*be_, compute_dtype(tc_.precision));
  // The probe's matrices are gone: peaks count training alone.
  MemoryStats::global().reset_peaks();
  // The whole job's model FLOPs: every DP replica's micro-batches.
  flops_per_step_ =
      train_step_->model().flops_per_step(tc_.micro_batch_size * tc_.seq_len, tc_.seq_len) *
      double(tc_.grad_accum_steps) * double(config_.parallel.dp);
  message("attention: " + attention_path_);
  message(fmt::format(
      "training {} ({} parameters, {} bottleneck) for {} steps of {} tokens on {} rank(s) (tp {} "
      "\"{}\") x {} threads, {}; GEMM peak {:.0f} GFLOP/s per rank; recompute \"{}\"; planned "
      "memory of rank 0: {} ({}); backend {}, comm {}",
      options_.config_path, config_.model.parameter_count(),
      bottleneck_kind_name(config_.model.bottleneck), tc_.steps, config_.tokens_per_step(),
      world_.size(), config_.parallel.tp, config_.parallel.tp_mode->name(), omp_get_max_threads(),
      tc_.precision == Precision::bf16 ? fmt::format("bf16 (GEMMs: {})", be_->bf16_gemm_path())
                                       : std::string("fp32"),
      peak_->gflops(), recompute_name(tc_.recompute), format_bytes(plan_.total()),
      describe_memory(plan_), be_->name(), comm_name(config_.parallel.comm, tc_.backend)));
  if (const std::string dp = train_step_->data_parallel().describe(); !dp.empty()) message(dp);
  message(tokenizer_
              ? fmt::format("tokenizer: {} (saved with every checkpoint)", tokenizer_->describe())
              : std::string("tokenizer: none (token ids without a tokenizer)"));
  if (loader_->source_count() > 1) message("data.train: " + loader_->describe());
}

// The checkpoint a run killed now would leave: this run's last save, else the one it resumed
// from, else none.
std::string Trainer::newest_checkpoint() const {
  if (last_saved_ < 0) return "none (nothing of this run is saved yet)";
  return store_->latest() ? *store_->latest() : std::string("none");
}

TrainResult Trainer::run(StopRequests& signals) {
  try {
    return run_steps(signals);
  } catch (const Error& e) {
    save_before_failing(e.what());
    throw;
  } catch (const std::exception& e) {
    save_before_failing(e.what());
    throw;
  }
}

// An error in the middle of a run (an internal one above all) costs at most the step it broke:
// the steps trained since the last checkpoint are saved first, when the weights are those of a
// whole step. One process only: under mpirun the other ranks may wait in another collective,
// and the job ends through report_fatal_error.
void Trainer::save_before_failing(const std::string& what) {
  if (world_.size() != 1 || step_ <= 0 || last_saved_ == step_ || !store_ || folder_lost_) return;
  if (train_step_->updating()) {
    message(fmt::format(
        "the error below broke step {} while it updated the weights, which are therefore not "
        "saved; the newest checkpoint is {}",
        step_ + 1, newest_checkpoint()));
    return;
  }
  // A checkpoint of weights that give a non-finite loss, or of non-finite weights or moments,
  // would be the newest one and resume into the same failure: not saved.
  if (train_step_->loss_not_finite()) {
    message(fmt::format(
        "step {}'s weights give a non-finite loss (that of step {}), so they are not saved; the "
        "newest checkpoint is {}",
        step_, step_ + 1, newest_checkpoint()));
    return;
  }
  try {
    if (const std::string tensor = first_nonfinite_tensor(); !tensor.empty()) {
      message(fmt::format(
          "step {}'s tensor '{}' holds a non-finite value, so the step is not saved; the newest "
          "checkpoint is {}",
          step_, tensor, newest_checkpoint()));
      return;
    }
    const std::string dir = save_checkpoint(/*wait=*/true);
    message(
        fmt::format("step {}: checkpoint {} (saved before reporting the error below)", step_, dir));
  } catch (const std::exception& e) {
    message(
        fmt::format("step {} could not be saved before the error below ({}): {}; the newest "
                    "checkpoint is {}",
                    step_, what.substr(0, 200), e.what(), newest_checkpoint()));
  }
}

// The first parameter or AdamW moment (named as a checkpoint names it) that holds a NaN or an
// infinity; "" when every value is finite. One process only (save_before_failing's case): the
// whole model is here, read one parameter at a time, as a save reads it.
std::string Trainer::first_nonfinite_tensor() {
  const ParameterStore& params = train_step_->model().parameters();
  Backend& be = params.backend();
  std::vector<FlatSource> sources{train_step_->data_parallel().held_masters()};
  for (FlatSource& state : train_step_->optimizer().held_state()) sources.push_back(state);
  std::vector<float> host;  // [one parameter]
  for (const FlatSource& source : sources)
    for (const ParamSpec& spec : params.specs()) {
      host.resize(size_t(spec.shape.numel()));
      be.to_host(host.data(), source.data.view(spec.offset, spec.shape));
      if (!std::all_of(host.begin(), host.end(), [](float f) { return std::isfinite(f); }))
        return source.prefix + spec.name;
    }
  return "";
}

TrainResult Trainer::run_steps(StopRequests& signals) {
  TrainResult result;
  // A signal during the setup: every rank learns of it before any step.
  if (const StopRequest early = agree_on_stop(signals); early.signal != 0) {
    message(fmt::format(
        "stopped by signal {} before step {}: nothing trained, nothing saved by this run; the "
        "newest checkpoint is {}",
        early.signal, step_ + 1,
        options_.resume && store_->latest() ? *store_->latest() : std::string("none")));
    result.interrupted = true;
    result.steps_done = step_;
    result.last_checkpoint = store_->latest().value_or("");
    return result;
  }
  int64_t skipped_in_a_row = 0;
  while (step_ < tc_.steps) {
    const auto t0 = std::chrono::steady_clock::now();
    if (leader_)
      signals.set_notice(fmt::format(
          "finishing step {}{}, then saving a checkpoint and exiting; the newest saved "
          "checkpoint, until \"stopped by signal\" is printed, is {}\n",
          step_ + 1,
          // The ranks agree on a stop after each step: one that gets the signal later (mpirun
          // signals them one after another) makes it the step after.
          world_.size() > 1 ? " (or the next, if another rank gets the signal later)" : "",
          newest_checkpoint()));
    const std::map<std::string, CommCounter> comm_before = comm_totals();
    read_batch();
    kill_failpoint(world_.rank(), step_ + 1, train_step_->model().parameters());
    const StepResult r = train_step_->step(step_);
    if (r.skipped) {
      message(fmt::format("step {}: loss {}, grad norm {}: not finite; step skipped", step_ + 1,
                          message_number(r.loss), message_number(r.grad_norm)));
      // Skipping for ever trains nothing: a run that diverged stops, naming the step.
      if (++skipped_in_a_row > tc_.max_skipped_steps)
        fail(
            "{}: step {}: {} non-finite steps in a row (now loss {}, grad norm {}), more than "
            "training.max_skipped_steps = {}; the run diverged: lower optimizer.lr or resume "
            "from an earlier checkpoint",
            options_.config_path, step_ + 1, skipped_in_a_row, message_number(r.loss),
            message_number(r.grad_norm), tc_.max_skipped_steps);
    } else {
      skipped_in_a_row = 0;
    }
    ++step_;
    log_step(
        r, std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count(),
        comm_before);
    result.last_loss = r.loss;
    // Before the evaluation: a stop saves at once, which under mpirun must fit in the
    // launcher's grace period.
    const StopRequest stop = agree_on_stop(signals);
    if (eval_due() && !stop.any()) {
      result.last_val_loss = evaluate();
      if (metrics_) metrics_->log_eval(step_, result.last_val_loss);
    }
    if (checkpoint_due() || stop.any()) {
      // A stop publishes at once: the launcher's grace period is short.
      const auto saving = std::chrono::steady_clock::now();
      result.last_checkpoint = save_checkpoint(stop.any());
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - saving).count();
      message(fmt::format("step {}: checkpoint {} ({} {:.3f} s{})", step_, result.last_checkpoint,
                          store_->save_pending() ? "copied in" : "saved in", seconds,
                          store_->save_pending() ? ", being written in the background" : ""));
    }
    if (stop.write_failed)
      fail("{}; stopped after step {} with checkpoint {}",
           metrics_ ? metrics_->describe_write_error()
                    : fmt::format("{}: cannot write metrics.jsonl (on rank 0)",
                                  in_folder(config_.checkpoint.folder, config_.metrics.jsonl)),
           step_, result.last_checkpoint);
    if (stop.any()) {
      message(fmt::format("stopped by signal {} after step {}; resume with --resume", stop.signal,
                          step_));
      result.interrupted = true;
      break;
    }
  }
  finish(result);
  return result;
}

// The step's micro-batches from the training data, their token ids checked.
void Trainer::read_batch() {
  for (int m = 0; m < train_step_->micro_batches(); ++m) {
    const Tensor inputs = train_step_->inputs()[size_t(m)],
                 targets = train_step_->targets()[size_t(m)];
    loader_->next(*be_, inputs, targets);
    check_vocabulary(loader_->staged_inputs(), config_.model.vocab_size, loader_->last_file());
    check_vocabulary(loader_->staged_targets(), config_.model.vocab_size, loader_->last_file());
  }
}

// Each group's counters so far (this rank's), by the group's name; the world's only carries
// the run's agreements (configuration, stops), not the step's work. The step's last call,
// complete(), has added every started call's time by the time they are read.
std::map<std::string, CommCounter> Trainer::comm_totals() const {
  std::map<std::string, CommCounter> totals;
  for (const Communicator* group : {groups_.tp.get(), groups_.pp.get(), groups_.dp.get()})
    if (group && group->size() > 1) totals[group->name()] = group->stats().total();
  return totals;
}

namespace {

// What each group's calls took during one step, as Megatron's timers print it: the calls'
// own seconds, and the part the step waited for (the rest ran beside its kernels).
nlohmann::json comm_of_step(const std::map<std::string, CommCounter>& before,
                            const std::map<std::string, CommCounter>& after) {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [name, now] : after) {
    const auto it = before.find(name);
    const CommCounter was = it == before.end() ? CommCounter{} : it->second;
    out[name] = {{"calls", now.calls - was.calls},
                 {"bytes", now.bytes - was.bytes},
                 {"s", now.seconds - was.seconds},
                 {"exposed_s", now.exposed_seconds - was.exposed_seconds}};
  }
  return out;
}

}  // namespace

// One metrics.jsonl line (rank 0); `ms` is the whole step, reading its batch included;
// "comm" is rank 0's communication during it, per group.
void Trainer::log_step(const StepResult& r, double ms,
                       const std::map<std::string, CommCounter>& comm_before) {
  const double tokens_per_s = double(config_.tokens_per_step()) / (ms / 1e3);
  rates_.push_back(tokens_per_s);
  // The whole model's FLOPs over the whole job's GEMM peak.
  const std::optional<double> mfu =
      peak_->utilization(flops_per_step_ / (ms * 1e6) / world_.size());
  const nlohmann::json memory = peak_memory_per_rank(world_);
  if (metrics_)
    metrics_->log_step({{"step", step_},
                        {"loss", r.loss},
                        {"lr", r.lr},
                        {"grad_norm", r.grad_norm},
                        {"tokens_per_s", tokens_per_s},
                        {"mfu", mfu ? nlohmann::json(*mfu) : nlohmann::json(nullptr)},
                        {"peak_bytes", MemoryStats::global().peak_total()},
                        {"activation_bytes", MemoryStats::global().peak(MemoryTag::activations)},
                        {"memory", memory},
                        {"memory_plan", plan_per_rank_},
                        {"ms", ms},
                        {"comm", comm_of_step(comm_before, comm_totals())},
                        {"tokens_seen", step_ * config_.tokens_per_step()},
                        {"epoch", loader_->epoch()},
                        {"skipped", r.skipped}});
}

bool Trainer::eval_due() const {
  return val_ && tc_.eval_interval > 0 && (step_ % tc_.eval_interval == 0 || step_ == tc_.steps);
}

// Mean loss over the first training.eval_batches validation batches, always the same ones.
double Trainer::evaluate() {
  val_->set_position(LoaderPosition{});
  const Tensor inputs = train_step_->inputs()[0], targets = train_step_->targets()[0];
  double total = 0.0;
  for (int64_t i = 0; i < tc_.eval_batches; ++i) {
    val_->next(*be_, inputs, targets);
    check_vocabulary(val_->staged_inputs(), config_.model.vocab_size, val_->last_file());
    check_vocabulary(val_->staged_targets(), config_.model.vocab_size, val_->last_file());
    total += train_step_->eval_step();
  }
  return reduce_scalar(groups_.pp.get(), total, ReduceOp::sum, "pp.eval_loss") /
         double(tc_.eval_batches);
}

// A signal may reach the ranks at different steps: they agree before acting on it. A failed
// metrics write (rank 0 only) stops every rank too, after a checkpoint.
StopRequest Trainer::agree_on_stop(const StopRequests& signals) {
  int32_t flags[2] = {signals.requested(), metrics_ && !metrics_->write_error().empty()};
  if (world_.size() > 1)
    world_.all_reduce(host_tensor(std::span(flags)), ReduceOp::max, "train.stop");
  return StopRequest{flags[0], flags[1] != 0};
}

bool Trainer::checkpoint_due() const {
  return (config_.checkpoint.interval > 0 && step_ % config_.checkpoint.interval == 0) ||
         step_ == tc_.steps;
}

// Every rank takes part, each writing what it holds.
std::string Trainer::save_checkpoint(bool wait) {
  check_folder_held(fmt::format("saving step {}", step_));
  // What this rank holds, written in place: no buffer of the model's size (the memory plan
  // holds through a save). A folder deleted while the save wrote fails the save on every rank,
  // said as what it is (the store's folder guard).
  const FlatSource masters = train_step_->data_parallel().held_masters();
  const std::string dir =
      config_.checkpoint.async
          ? store_->save_async(train_step_->model(), train_step_->optimizer(), masters,
                               trainer_state(), step_, groups_.dp.get(), &world_)
          : store_->save(train_step_->model(), train_step_->optimizer(), masters, trainer_state(),
                         step_, groups_.dp.get(), &world_);
  if (wait) store_->finish_pending(&world_);
  // A folder deleted or taken while the save wrote: the checkpoint may be in another run's
  // folder, or in one made anew by the save, and is not reported as this run's.
  check_folder_held(fmt::format("reporting {}", dir));
  last_saved_ = step_;
  return dir;
}

// Rank 0 holds checkpoint.folder's lock; when the folder was deleted or replaced (another run
// in it), every rank stops with rank 0's message, before a save writes into a folder not the
// run's and before it reports one.
void Trainer::check_folder_held(const std::string& before) {
  run_on_root_or_fail_together(world_, 0, [&] {
    if (const std::string lost = folder_lost(before); !lost.empty()) fail("{}", lost);
  });
}

// The error of a run whose folder is no longer its own, or "" while it is (and on the ranks
// that hold no lock).
std::string Trainer::folder_lost(const std::string& before) {
  const std::string why = lock_ ? lock_->lost() : std::string();
  if (why.empty()) return "";
  folder_lost_ = true;
  return fmt::format(
      "{}: checkpoint.folder was deleted or replaced while this run trained ({}); the run stops "
      "before {}, as its checkpoints and metrics would mix with what is there now",
      config_.checkpoint.folder, why, before);
}

// The last checkpoint (unless the last step has one), the median rate and the plot.
void Trainer::finish(TrainResult& result) {
  if (last_saved_ != step_ && step_ > 0) result.last_checkpoint = save_checkpoint();
  store_->finish_pending(&world_);
  check_folder_held("reporting the end of the run");
  result.steps_done = step_;
  if (!rates_.empty()) result.tokens_per_s = median(rates_);
  if (metrics_ && !config_.metrics.plot.empty() && step_ > 0) {
    const std::string png = in_folder(config_.checkpoint.folder, config_.metrics.plot);
    plot_metrics(metrics_->path(), png);
    message("plot: " + png);
  }
}

}  // namespace

TrainResult train(const TrainConfig& config, const TrainOptions& options) {
  StopRequests signals;
  Trainer trainer(config, options);
  if (std::optional<TrainResult> done = trainer.start()) return *done;
  return trainer.run(signals);
}

}  // namespace bottle
