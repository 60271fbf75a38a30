#pragma once
// The TOML training configuration (docs/design.md §12): TorchTitan-like sections,
// each a struct below. One schema table in train_config.cpp (key path, type, range,
// default, doc) drives parsing, `--set section.key=value` overrides, validation, the
// key listing of `describe_config_keys()` and the TOML written back by `to_toml()`.
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "backend/backend_options.h"
#include "core/setting_error.h"
#include "model/config.h"
#include "parallel/recompute.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_layout.h"
#include "pipeline/schedule.h"  // PipelineSchedule; TOML: the registry's names (schedules())
#include "train/adamw.h"
#include "train/lr_schedule.h"  // LrDecay
#include "train/muon.h"

namespace bottle {

enum class Precision { fp32, bf16 };
// The kernel backend a run computes on (training.backend), in core's kBackendNames order.
enum class BackendKind { cpu, reference, cuda };
// How process groups move device tensors (parallel.comm): auto is nccl for the cuda backend
// and mpi otherwise; mpi with the cuda backend stages through host memory, so several ranks
// may share one GPU.
enum class CommKind { automatic, mpi, nccl };
enum class OnNonfinite { stop, skip };

// The TOML spelling of each value.
const char* enum_name(Recompute value);
const char* enum_name(Precision value);
const char* enum_name(BackendKind value);
const char* enum_name(CommKind value);
// parallel.comm resolved for a backend: "mpi" or "nccl".
const char* comm_name(CommKind comm, BackendKind backend);
const char* enum_name(OnNonfinite value);
const char* enum_name(LrDecay value);
const char* enum_name(PipelineSchedule value);
const char* enum_name(NormStatistic value);
const char* enum_name(TpBackward value);
// The dtype of the weights GEMMs read and of the activations: bf16 under mixed precision.
inline DType compute_dtype(Precision p) { return p == Precision::bf16 ? DType::bf16 : DType::f32; }

struct TrainingConfig {
  int64_t steps = 1000;
  int64_t micro_batch_size = 8;  // sequences per micro-batch and data-parallel rank
  int64_t seq_len = 256;         // <= model.max_seq_len
  int64_t grad_accum_steps = 1;  // micro-batches per optimizer step (pipeline micro-batches)
  int64_t seed = 1234;
  double max_norm = 1.0;  // global gradient-norm clip; 0: no clipping
  Recompute recompute = Recompute::none;
  int64_t memory_limit = 0;  // bytes per rank; 0: no limit
  Precision precision = Precision::fp32;
  BackendKind backend = BackendKind::cpu;
  AttentionChoice attention = AttentionChoice::automatic;  // the cuda backend's attention kernels
  OnNonfinite on_nonfinite = OnNonfinite::stop;
  int64_t max_skipped_steps = 10;  // on_nonfinite = "skip": non-finite steps in a row allowed
  int64_t eval_interval = 100;     // steps between validation evals; 0: never
  int64_t eval_batches = 8;
};

// optimizer.name: AdamW for every parameter, or Muon for the blocks' matrices (train/muon.h).
enum class OptimizerKind { adamw, muon };
const char* enum_name(OptimizerKind value);

struct OptimizerConfig {
  OptimizerKind name = OptimizerKind::adamw;
  double lr = 3e-4;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double muon_momentum = 0.95;
  bool muon_nesterov = true;
  int64_t muon_ns_steps = 5;

  AdamWConfig adamw() const;
  MuonConfig muon() const;
};

struct LrSchedulerConfig {
  int64_t warmup_steps = 0;
  LrDecay decay = LrDecay::cosine;
  double min_lr_ratio = 0.1;  // final lr / optimizer.lr
};

struct DataConfig {
  // Shard files, directories or globs, one per source; the trainer requires one. Several make
  // a weighted mixture (train/data_mixture.h).
  std::vector<std::string> train;
  // Each source's share of the training windows, in train's order (any positive scale);
  // empty: each source weighs its size, as if the sources were one.
  std::vector<double> weights;
  std::string val;  // empty: no validation
  // A tokenizer file or directory; empty: the one `bottle prepare` saved beside the training
  // shards (DIR/tokenizer), else none (byte-level data). It travels into every checkpoint.
  std::string tokenizer;
};

struct CheckpointConfig {
  std::string folder = "checkpoints";
  int64_t interval = 0;  // 0: only at the end
  int64_t keep = 3;
  // Each rank copies what it holds to host memory and a background thread writes it while
  // training goes on (CheckpointStore::save_async).
  bool async = false;
};

struct MetricsConfig {
  int64_t log_freq = 1;
  std::string jsonl = "metrics.jsonl";  // relative paths: relative to checkpoint.folder
  std::string plot = "loss.png";        // likewise
  std::string tensorboard;              // an event file's directory, likewise; "": none
};

struct ParallelConfig {
  int tp = 1, pp = 1, dp = 1;
  // The TP mode's layout (parallel/tp_layouts.h). Null until the configuration is resolved,
  // which gives default_tp_layout(model.shape()) when the key is not set.
  const TpLayout* tp_mode = nullptr;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  // Model chunks per pipeline rank (virtual stages): > 1 only for a schedule that interleaves
  // chunks (interleaved_1f1b), which needs it.
  int virtual_stages = 1;
  int zero = 0;  // ZeRO stage, 0 to 3
  // Gradient buckets reduced over the DP group during the step's last backward, on the
  // group's communication thread (DataParallel): the same sums, so the same bits, either way.
  bool overlap_grad_reduce = true;
  // ZeRO: the updated parameters' all-gathers run under the next step's forward, each bucket
  // waited for where the forward first reads it (Megatron's --overlap-param-gather).
  bool overlap_param_gather = true;
  // The gradient buckets' size in MiB (PyTorch DDP's bucket_cap_mb): smaller buckets start
  // earlier in backward, larger ones pay a link's latency fewer times.
  double bucket_mb = 32;
  // Each micro-batch's block passes as two halves of its sequences whose TP collectives
  // travel while the other half computes (DeepSpeed Domino; parallel/tp_overlap.h).
  bool tp_overlap = TensorParallel{}.overlap;
  bool grouping = TensorParallel{}.grouping;  // its one default is the mechanism's
  NormStatistic norm_statistic = TensorParallel{}.norm_backward;  // btp's, the same way
  // Where the TP backward puts an input gradient's collective: under the weight gradient
  // (async, Megatron's order) or after it (serial).
  TpBackward tp_backward = TensorParallel{}.backward;
  CommKind comm = CommKind::automatic;
  // Seconds one collective or transfer may wait for its peers before the job ends naming
  // the rank and host it waited for (Communicator::timeout): PyTorch's NCCL default.
  int comm_timeout = 600;
};

struct TrainConfig {
  ModelConfig model;
  TrainingConfig training;
  OptimizerConfig optimizer;
  LrSchedulerConfig lr_scheduler;
  DataConfig data;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;
  ParallelConfig parallel;

  AdamWConfig adamw() const { return optimizer.adamw(); }
  MuonConfig muon() const { return optimizer.muon(); }
  // Tokens consumed by one optimizer step over all data-parallel ranks.
  int64_t tokens_per_step() const {
    return training.micro_batch_size * training.seq_len * training.grad_accum_steps * parallel.dp;
  }
};

// The configuration key of a setting that code below src/train names (core/setting_error.h):
// "parallel.tp".
const char* config_key(Setting setting);
// A SettingError as the user reads it: every setting named by its key. With `source` (a file,
// or "--set", where the value came from), the message starts with it and names the wrong
// setting as key '...', as every other configuration error does.
std::string describe_setting_error(const SettingError& error, const std::string& source = {});
// Why parallel.tp_overlap cannot run `config`, as the rest of a sentence that starts with the
// key ("splits each micro-batch into two halves ..."), or empty when it can (or is off). The
// loader refuses such a configuration, and the planner excludes such a layout, by this one rule.
std::string tp_overlap_refusal(const TrainConfig& config);
// Why `config`'s pipeline schedule cannot run, as a whole sentence naming its key
// (parallel.schedule, parallel.virtual_stages or training.grad_accum_steps), or empty when it
// can: a chunk count the schedule does not take, a shape its generator refuses, a list the
// model does not run yet (schedule_unrunnable), or what a split backward does not combine with
// (split_backward_refusal). The loader refuses such a configuration, and the planner excludes
// such a layout, by this one rule.
std::string schedule_refusal(const TrainConfig& config);
// Why bottle's model cannot run the lists of `schedule` yet, or empty when it can: the one
// place that says which passes and chunks TrainStageWork (train/stage_work.h) runs. Today:
// chunk 0, its backward whole (BW) or as B and W, so schedules with several chunks are refused.
std::string schedule_unrunnable(PipelineSchedule schedule);
// Why a schedule splitting the backward into B and W passes (zb_h1) cannot run beside the rest
// of `config`, as a whole sentence naming the key, or empty: a pipeline of one stage (no
// bubble to fill), recomputation or TP overlap (a deferred weight gradient reads the block's
// own buffers after its backward), ZeRO-2/3 under DP (their slots follow BW passes).
std::string split_backward_refusal(const TrainConfig& config);
inline bool schedule_runnable(PipelineSchedule schedule) {
  return schedule_unrunnable(schedule).empty();
}

// Compares every key of the schema; config_difference names the first key that differs
// ("training.steps: 10 vs 20"), or returns "" when the two are equal.
std::string config_difference(const TrainConfig& a, const TrainConfig& b);
inline bool operator==(const TrainConfig& a, const TrainConfig& b) {
  return config_difference(a, b).empty();
}

// The keys a configuration file and --set gave, as given (before defaults were resolved).
struct ConfigKeysGiven {
  std::set<std::string> file, set;
};

// Reads a TOML file, applies `overrides` ("section.key=value", as given to --set), resolves
// defaults that depend on other keys (model.num_kv_heads, parallel.tp_mode) and validates.
// Throws bottle::Error naming the file (or "--set") and the offending key.
TrainConfig load_train_config(const std::string& path,
                              const std::vector<std::string>& overrides = {},
                              ConfigKeysGiven* given = nullptr);
// The same from TOML text; `source_name` stands for the file in messages.
TrainConfig parse_train_config_string(const std::string& toml_text, const std::string& source_name,
                                      const std::vector<std::string>& overrides = {},
                                      ConfigKeysGiven* given = nullptr);
// For a command that reads its model from a checkpoint rather than a configuration file
// (eval, sample): `overrides` parsed, range-checked and validated by the same schema and with
// the same messages as train's --set, over the defaults with `model` as [model].
TrainConfig apply_config_overrides(const ModelConfig& model,
                                   const std::vector<std::string>& overrides,
                                   ConfigKeysGiven* given = nullptr);

// What a command reads of the configuration, so that no key is silently ignored.
struct CommandKeys {
  std::string command;                // "bench tp"
  std::vector<std::string> honoured;  // keys, or whole sections as "section."
  // Keys of a training run that do not change what the command does (data.*, checkpoint.*):
  // accepted in a training configuration file, refused by --set.
  std::vector<std::string> run_keys;
  std::string reason;  // why it reads no other key: "it times one training step per TP mode"
};
// Refuses every key --set gives outside `keys.honoured`, and every key the file sets to a
// value other than its default outside both lists, naming the key and the command's reason.
void check_honoured_keys(const TrainConfig& config, const ConfigKeysGiven& given,
                         const std::string& source, const CommandKeys& keys);

// The whole resolved configuration as TOML (every key that has a value; unset optional keys
// appear as comments). Parsing it again gives an equal TrainConfig.
std::string to_toml(const TrainConfig& config);

// The value of key `path` ("data.train") in `config` as TOML writes it ("unset" when it has
// none), for messages.
std::string config_value_text(const TrainConfig& config, const std::string& path);

// Every key with its type, range, default and a one-line description (--help-config).
std::string describe_config_keys();

}  // namespace bottle
