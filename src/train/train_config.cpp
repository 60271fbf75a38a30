// The training configuration's schema: the table of every key (build_schema, the place to add
// one), the TOML names of its enums and the keys of the settings that code below src/train
// names. What a key is lives in config_key.h; reading, checking and writing a configuration in
// config_loader.cpp.
#include "train/train_config.h"

#include <array>
#include <string>
#include <vector>

#include "core/error.h"
#include "model/llama.h"
#include "parallel/tp_layouts.h"
#include "train/config_key.h"

namespace bottle {

namespace {

constexpr std::array<const char*, 2> kPrecisionNames = {"fp32", "bf16"};
constexpr std::array<const char*, 3> kCommNames = {"auto", "mpi", "nccl"};
constexpr std::array<const char*, 2> kOnNonfiniteNames = {"stop", "skip"};
constexpr std::array<const char*, 2> kOptimizerNames = {"adamw", "muon"};

}  // namespace

const char* enum_name(Recompute value) { return kRecomputeNames[int(value)]; }
const char* enum_name(Precision value) { return kPrecisionNames[int(value)]; }
const char* enum_name(BackendKind value) { return kBackendNames[int(value)]; }
const char* enum_name(CommKind value) { return kCommNames[int(value)]; }
const char* comm_name(CommKind comm, BackendKind backend) {
  if (comm == CommKind::automatic) return backend == BackendKind::cuda ? "nccl" : "mpi";
  return enum_name(comm);
}
const char* enum_name(OnNonfinite value) { return kOnNonfiniteNames[int(value)]; }
const char* enum_name(OptimizerKind value) { return kOptimizerNames[int(value)]; }
const char* enum_name(LrDecay value) { return kLrDecayNames[int(value)]; }
const char* enum_name(PipelineSchedule value) { return schedule_name(value); }
const char* enum_name(NormStatistic value) { return kNormStatisticNames[int(value)]; }
const char* enum_name(TpBackward value) { return kTpBackwardNames[int(value)]; }

const char* config_key(Setting setting) {
  switch (setting) {
    case Setting::tp:
      return "parallel.tp";
    case Setting::pp:
      return "parallel.pp";
    case Setting::dp:
      return "parallel.dp";
    case Setting::tp_mode:
      return "parallel.tp_mode";
    case Setting::recompute:
      return "training.recompute";
    case Setting::vocab_size:
      return "model.vocab_size";
    case Setting::hidden_size:
      return "model.hidden_size";
    case Setting::intermediate_size:
      return "model.intermediate_size";
    case Setting::num_heads:
      return "model.num_heads";
    case Setting::num_kv_heads:
      return "model.num_kv_heads";
    case Setting::num_layers:
      return "model.num_layers";
    case Setting::bottleneck:
      return "model.bottleneck";
  }
  return "?";
}

std::string tp_overlap_refusal(const TrainConfig& config) {
  const ParallelConfig& p = config.parallel;
  if (!p.tp_overlap) return {};
  if (config.training.micro_batch_size % 2)
    return fmt::format(
        "splits each micro-batch into two halves of its sequences: it needs an even "
        "training.micro_batch_size, not {}",
        config.training.micro_batch_size);
  // LaX's latents cross a stage boundary as one [N, r] tensor per projection; the halves hold
  // theirs apart.
  if (config.model.bottleneck == BottleneckKind::lax && p.pp > 1)
    return fmt::format(
        "does not run LaX over a pipeline (parallel.pp = {}) yet: its latents cross the stage "
        "boundary whole",
        p.pp);
  return {};
}

std::string schedule_unrunnable(PipelineSchedule schedule) {
  // TrainStageWork (train/stage_work.h) runs chunk 0, its backward whole (BW) or split into B
  // and W (LlamaModel's defer_weight_grads); relax this when the model runs chunks.
  const ScheduleInfo& info = schedule_info(schedule);
  if (info.needs_virtual_stages)
    return fmt::format("the model does not yet run several chunks per stage, which {} interleaves",
                       info.name);
  return {};
}

std::string split_backward_refusal(const TrainConfig& config) {
  const ParallelConfig& p = config.parallel;
  const ScheduleInfo& info = schedule_info(p.schedule);
  if (!info.splits_weight_pass) return {};
  const std::string key = fmt::format("key 'parallel.schedule' = \"{}\"", info.name);
  // (Short: `bottle plan` prints it beside the layout it excludes.)
  if (p.pp == 1)
    return fmt::format("{} needs parallel.pp >= 2: one stage has no bubble to fill", key);
  // Its W pass reads every block's activations after the block's B: nothing may rebuild them.
  if (config.training.recompute != Recompute::none)
    return fmt::format("{} needs training.recompute = \"none\": W reads the kept activations", key);
  if (p.tp_overlap)
    return fmt::format("{} does not run beside parallel.tp_overlap (their buffers clash)", key);
  // ZeRO-2 reduces each micro-batch's gradients out of per-unit slots as each unit's backward
  // ends, and ZeRO-3 gathers each unit's parameters for it: both would have to follow the W
  // passes.
  if (p.zero >= 2 && p.dp > 1)
    return fmt::format("{} needs parallel.zero 0 or 1 under data parallelism, not {}", key, p.zero);
  return {};
}

std::string schedule_refusal(const TrainConfig& config) {
  const ParallelConfig& p = config.parallel;
  const ScheduleInfo& info = schedule_info(p.schedule);
  if (info.needs_virtual_stages && p.virtual_stages < 2)
    return fmt::format(
        "key 'parallel.schedule' = \"{}\" interleaves model chunks: it needs "
        "parallel.virtual_stages >= 2, not {}",
        info.name, p.virtual_stages);
  if (!info.needs_virtual_stages && p.virtual_stages != 1)
    return fmt::format(
        "key 'parallel.virtual_stages' = {} needs parallel.schedule = \"interleaved_1f1b\"; "
        "\"{}\" runs one chunk per stage",
        p.virtual_stages, info.name);
  const std::string shape =
      schedule_shape_error(p.schedule, p.pp, config.training.grad_accum_steps, p.virtual_stages);
  if (!shape.empty())
    return fmt::format(
        "key 'training.grad_accum_steps' = {} with parallel.schedule = \"{}\" and "
        "parallel.pp = {}: {}",
        config.training.grad_accum_steps, info.name, p.pp, shape);
  if (const std::string unrunnable = schedule_unrunnable(p.schedule); !unrunnable.empty())
    return fmt::format("key 'parallel.schedule' = \"{}\": {}", info.name, unrunnable);
  return split_backward_refusal(config);
}

std::string describe_setting_error(const SettingError& error, const std::string& source) {
  const std::string text = error.render([&](Setting setting, bool wrong) {
    if (wrong && !source.empty()) return fmt::format("key '{}'", config_key(setting));
    return std::string(config_key(setting));
  });
  return source.empty() ? text : fmt::format("{}: {}", source, text);
}

AdamWConfig OptimizerConfig::adamw() const {
  AdamWConfig c;
  c.lr = float(lr);
  c.beta1 = float(beta1);
  c.beta2 = float(beta2);
  c.eps = float(eps);
  c.weight_decay = float(weight_decay);
  return c;
}

MuonConfig OptimizerConfig::muon() const {
  MuonConfig c;
  c.momentum = float(muon_momentum);
  c.nesterov = muon_nesterov;
  c.ns_steps = int(muon_ns_steps);
  return c;
}

namespace config_keys {

namespace {

// parallel.tp_mode: a TP mode's layout, spelled by its name; the choices are the registered
// modes (parallel/tp_layouts.h). Unset (null) until the configuration is resolved.
ConfigKey tp_mode_key(std::string path, std::string doc, std::string default_note) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::choice;
  for (const char* name : tp_layout_names()) k.choices.emplace_back(name);
  k.optional = true;
  k.doc = std::move(doc);
  k.default_note = std::move(default_note);
  k.get = [](const TrainConfig& c) -> Value {
    if (!c.parallel.tp_mode) return std::monostate{};
    return std::string(c.parallel.tp_mode->name());
  };
  k.set = [](TrainConfig& c, const Value& v) {
    c.parallel.tp_mode = find_tp_layout(std::get<std::string>(v));
  };
  return k;
}

}  // namespace

// A reference to a member of TrainConfig, for a const or non-const config.
#define FIELD(member) \
  [](auto& c) -> auto& { return c.member; }

namespace {

// [data], [checkpoint], [metrics]: where a run reads and writes.
void add_run_keys(std::vector<ConfigKey>& s) {
  // [data]
  s.push_back(paths_key("data.train", FIELD(data.train),
                        "training tokens: a shard file, a directory or a glob (required to "
                        "train); an array of them is a mixture of sources, weighed by "
                        "data.weights"));
  s.push_back(numbers_key("data.weights", FIELD(data.weights), greater(0),
                          "each data.train source's share of the training batches, in its "
                          "order (normalised; [3, 1] = 75 % and 25 %)",
                          "each source's size in tokens, as one concatenated dataset"));
  s.push_back(string_key("data.val", FIELD(data.val),
                         "validation tokens: a shard file, a directory or a glob; empty = none"));
  s.push_back(string_key("data.tokenizer", FIELD(data.tokenizer),
                         "the tokenizer saved with every checkpoint: a SentencePiece .model, a "
                         "tokenizer.json, a .tiktoken file or a directory; empty = the one "
                         "`bottle prepare` saved beside data.train's shards, if any"));
  // [checkpoint]
  s.push_back(string_key("checkpoint.folder", FIELD(checkpoint.folder),
                         "directory of the run: checkpoints, metrics, plots"));
  s.push_back(integer_key("checkpoint.interval", FIELD(checkpoint.interval), at_least(0),
                          "steps between checkpoints; 0 = only at the end"));
  s.push_back(integer_key("checkpoint.keep", FIELD(checkpoint.keep), at_least(1),
                          "checkpoints kept (older ones are removed)"));
  s.push_back(bool_key("checkpoint.async", FIELD(checkpoint.async),
                       "write checkpoints in the background: each rank copies what it holds to "
                       "host memory at the step and training goes on while a thread writes it; "
                       "published at the next save, a stop or the end"));
  // [metrics]
  s.push_back(integer_key("metrics.log_freq", FIELD(metrics.log_freq), greater(0),
                          "steps between printed log lines (metrics.jsonl records every step)"));
  s.push_back(string_key("metrics.jsonl", FIELD(metrics.jsonl),
                         "per-step metrics, one JSON object a line (relative to "
                         "checkpoint.folder)"));
  s.push_back(string_key("metrics.plot", FIELD(metrics.plot),
                         "loss curve image (relative to checkpoint.folder)"));
  s.push_back(string_key("metrics.tensorboard", FIELD(metrics.tensorboard),
                         "a directory for TensorBoard's event files of the train/ and val/ "
                         "scalars (relative to checkpoint.folder; empty: none)"));
}

// parallel.schedule's names and its doc: the schedule registry's (pipeline/schedule.h).
std::vector<std::string> schedule_names() {
  std::vector<std::string> names;
  for (const ScheduleInfo& info : schedules()) names.emplace_back(info.name);
  return names;
}

std::string schedule_doc() {
  std::string doc = "pipeline schedule:";
  for (const ScheduleInfo& info : schedules())
    doc +=
        fmt::format("{} {} ({}{})", info.id == schedules().front().id ? "" : ";", info.name,
                    info.summary, schedule_runnable(info.id) ? "" : "; not run by the model yet");
  return doc;
}

// [parallel]: the layout over ranks, and how its communication runs.
void add_parallel_keys(std::vector<ConfigKey>& s) {
  s.push_back(integer_key("parallel.tp", FIELD(parallel.tp), greater(0), "tensor-parallel ranks"));
  s.push_back(integer_key("parallel.pp", FIELD(parallel.pp), greater(0), "pipeline stages"));
  s.push_back(integer_key("parallel.dp", FIELD(parallel.dp), greater(0), "data-parallel ranks"));
  s.push_back(tp_mode_key("parallel.tp_mode",
                          "full (Megatron TP, full-rank model), vanilla (Megatron TP on a "
                          "bottleneck model), btp (bottleneck-aware TP)",
                          "full for a full-rank model, btp for a bottleneck model"));
  s.push_back(
      choice_key("parallel.schedule", FIELD(parallel.schedule), schedule_names(), schedule_doc()));
  s.push_back(integer_key("parallel.virtual_stages", FIELD(parallel.virtual_stages), at_least(1),
                          "model chunks per pipeline stage (virtual stages): > 1 only with, and "
                          "needed by, parallel.schedule = \"interleaved_1f1b\""));
  s.push_back(integer_key("parallel.zero", FIELD(parallel.zero), closed(0, 3),
                          "ZeRO stage: 0 (replicated AdamW state), 1 (sharded), 2 (the "
                          "gradients sharded too: reduce-scattered after every micro-batch's "
                          "backward, block by block, and kept as 1/dp) or 3 (the parameters "
                          "too, FSDP: each rank keeps 1/dp of the fp32 weights, and each block's "
                          "are all-gathered before its forward and again before its backward)"));
  s.push_back(bool_key("parallel.overlap_grad_reduce", FIELD(parallel.overlap_grad_reduce),
                       "reduce gradient buckets over the DP group during the last backward, "
                       "last block first, while the rest of backward computes (all-reduced, "
                       "or reduce-scattered under ZeRO; the same bits as without)"));
  s.push_back(bool_key("parallel.overlap_param_gather", FIELD(parallel.overlap_param_gather),
                       "ZeRO: all-gather the updated parameters during the next forward, each "
                       "bucket waited for where it is first read (the same bits as without)"));
  s.push_back(number_key("parallel.bucket_mb", FIELD(parallel.bucket_mb), greater(0),
                         "MiB of gradients per DP bucket, all-reduced or reduce-scattered "
                         "(cut from the last layer back)"));
  s.push_back(bool_key("parallel.tp_overlap", FIELD(parallel.tp_overlap),
                       "split each micro-batch into two halves of its sequences whose blocks "
                       "run interleaved, so that one half's TP collectives travel while the "
                       "other half computes (DeepSpeed Domino); needs an even "
                       "training.micro_batch_size. The same activations; parameter gradients "
                       "summed half by half, as under gradient accumulation (fp32 rounding)"));
  s.push_back(bool_key("parallel.grouping", FIELD(parallel.grouping),
                       "one GEMM for projections reading the same input (q,k,v; gate,up)"));
  s.push_back(choice_key("parallel.tp_backward", FIELD(parallel.tp_backward), kTpBackwardNames,
                         "where the TP backward sums an input gradient over the group: "
                         "started as soon as it is computed and travelling while the layer's "
                         "weight gradient is (async: Megatron's order), or after the weight "
                         "gradient (serial: to measure what the overlap buys). The same bits"));
  s.push_back(choice_key("parallel.norm_statistic", FIELD(parallel.norm_statistic),
                         kNormStatisticNames,
                         "btp: how the online RMSNorm's backward gets its per-token sum over "
                         "the whole hidden: from the chunk's latent, which its all-reduce has "
                         "made whole (latent: no communication), or all-reduced over the TP "
                         "group (all_reduce: one more collective of b·s values per norm, to "
                         "compare against)"));
  s.push_back(choice_key("parallel.comm", FIELD(parallel.comm), kCommNames,
                         "collectives of the TP, PP and DP groups: nccl (GPU memory, one rank "
                         "per GPU), mpi (host memory; with cuda, staged through the host so "
                         "ranks may share a GPU) or auto (nccl on cuda, else mpi)"));
  s.push_back(integer_key("parallel.comm_timeout", FIELD(parallel.comm_timeout), greater(0),
                          "seconds a collective or pipeline transfer may wait for its peers "
                          "before the job ends naming the rank and host it waited for (a "
                          "stopped, dead or cut-off host)"));
}

}  // namespace

std::vector<ConfigKey> build_schema() {
  std::vector<ConfigKey> s;
  // [model]
  s.push_back(integer_key("model.vocab_size", FIELD(model.vocab_size), greater(0),
                          "vocabulary size (256: the byte-level tokenizer)"));
  s.push_back(
      integer_key("model.hidden_size", FIELD(model.hidden_size), greater(0), "model width d"));
  s.push_back(integer_key("model.intermediate_size", FIELD(model.intermediate_size), greater(0),
                          "MLP width d_ff"));
  s.push_back(
      integer_key("model.num_layers", FIELD(model.num_layers), greater(0), "transformer blocks"));
  s.push_back(integer_key("model.num_heads", FIELD(model.num_heads), greater(0),
                          "attention heads; must divide hidden_size"));
  s.push_back(integer_key("model.num_kv_heads", FIELD(model.num_kv_heads), greater(0),
                          "key/value heads (grouped-query attention); must divide num_heads",
                          "model.num_heads"));
  s.push_back(choice_key("model.bottleneck", FIELD(model.bottleneck), kBottleneckKindNames,
                         "every projection: none (full rank), svd (B·A), cola (B·σ(A·x)), "
                         "lax (CoLA with cross-layer latent crossing)"));
  s.push_back(unset_when_zero_key("model.rank", FIELD(model.rank),
                                  "bottleneck rank r of every projection",
                                  "model.hidden_size / 4"));
  for (int i = 0; i < kNumProjections; ++i) {
    s.push_back(unset_when_zero_key(
        fmt::format("model.ranks.{}", kProjectionNames[i]),
        [i](auto& c) -> auto& { return c.model.ranks[size_t(i)]; },
        fmt::format("rank of the {} projection (TOML: ranks = {{ {} = ... }})", kProjectionNames[i],
                    kProjectionNames[i]),
        "model.rank"));
  }
  s.push_back(bool_key("model.tie_embeddings", FIELD(model.tie_embeddings),
                       "share the embedding table with the LM head"));
  s.push_back(
      number_key("model.rms_norm_eps", FIELD(model.rms_norm_eps), greater(0), "RMSNorm epsilon"));
  s.push_back(number_key("model.rope_theta", FIELD(model.rope_theta), greater(0), "RoPE base"));
  s.push_back(integer_key("model.max_seq_len", FIELD(model.max_seq_len), greater(0),
                          "longest sequence the model accepts"));
  s.push_back(optional_bool_key("model.mlp_gate_act", FIELD(model.mlp_gate_act),
                                "apply SiLU to the MLP gate",
                                "true for a full-rank model, false otherwise"));
  // [training]
  s.push_back(integer_key("training.steps", FIELD(training.steps), greater(0), "optimizer steps"));
  s.push_back(integer_key("training.micro_batch_size", FIELD(training.micro_batch_size), greater(0),
                          "sequences per micro-batch and data-parallel rank"));
  s.push_back(integer_key("training.seq_len", FIELD(training.seq_len), greater(0),
                          "tokens per sequence (<= model.max_seq_len)"));
  s.push_back(integer_key("training.grad_accum_steps", FIELD(training.grad_accum_steps), greater(0),
                          "micro-batches per optimizer step (the pipeline's micro-batches)"));
  s.push_back(integer_key("training.seed", FIELD(training.seed), at_least(0),
                          "random seed (initialisation and data order)"));
  s.push_back(number_key("training.max_norm", FIELD(training.max_norm), at_least(0),
                         "clip the global gradient norm to this; 0 = no clipping"));
  s.push_back(choice_key("training.recompute", FIELD(training.recompute), kRecomputeNames,
                         "activation recomputation in backward: none, block (whole blocks), "
                         "lowrank (inside each chunk, keeping chunk boundaries)"));
  s.push_back(bytes_key("training.memory_limit", FIELD(training.memory_limit),
                        "refuse to start when a rank's planned memory (weights, gradients, "
                        "optimizer state, activations, buffers) exceeds this: bytes, or a "
                        "string such as \"20GiB\"",
                        "no limit"));
  s.push_back(choice_key("training.precision", FIELD(training.precision), kPrecisionNames,
                         "compute precision: fp32 or bf16"));
  s.push_back(choice_key("training.backend", FIELD(training.backend), kBackendNames,
                         "kernel backend: cpu (oneDNN + OpenMP), reference (naive loops, the "
                         "test oracle) or cuda (one GPU per rank, from the node-local rank)"));
  s.push_back(choice_key("training.attention", FIELD(training.attention), kAttentionChoiceNames,
                         "attention kernels: auto (cuDNN's SDPA for bf16 on cuda where cuDNN "
                         "loads and takes the shape, else the own kernels), cudnn (cuDNN or an "
                         "error saying why; cuda and bf16 only) or own (the backend's own "
                         "kernels)"));
  s.push_back(choice_key("training.on_nonfinite", FIELD(training.on_nonfinite), kOnNonfiniteNames,
                         "on a NaN/inf loss or gradient norm: stop, or skip the update"));
  s.push_back(integer_key("training.max_skipped_steps", FIELD(training.max_skipped_steps),
                          at_least(0),
                          "under on_nonfinite = \"skip\": the most non-finite steps in a row "
                          "before the run stops with an error naming the step"));
  s.push_back(integer_key("training.eval_interval", FIELD(training.eval_interval), at_least(0),
                          "steps between validation evaluations; 0 = never"));
  s.push_back(integer_key("training.eval_batches", FIELD(training.eval_batches), greater(0),
                          "validation batches per evaluation"));
  // [optimizer]
  s.push_back(choice_key("optimizer.name", FIELD(optimizer.name), kOptimizerNames,
                         "adamw (every parameter), or muon: Muon for every 2-D weight of the "
                         "blocks (each bottleneck factor on its own), AdamW (beta1, beta2, eps) "
                         "for the embedding, the LM head and the 1-D parameters"));
  s.push_back(number_key("optimizer.lr", FIELD(optimizer.lr), greater(0),
                         "peak learning rate (both optimizers; Muon's updates are scaled to "
                         "AdamW's RMS, 0.2·sqrt(max(rows, columns)))"));
  s.push_back(number_key("optimizer.weight_decay", FIELD(optimizer.weight_decay), at_least(0),
                         "decoupled weight decay (not on norms and embeddings)"));
  s.push_back(number_key(
      "optimizer.beta1", [](auto& c) -> auto& { return c.optimizer.beta1; }, half_open(0, 1),
      "AdamW first-moment decay"));
  s.push_back(number_key(
      "optimizer.beta2", [](auto& c) -> auto& { return c.optimizer.beta2; }, half_open(0, 1),
      "AdamW second-moment decay"));
  s.push_back(number_key("optimizer.eps", FIELD(optimizer.eps), greater(0), "AdamW epsilon"));
  s.push_back(number_key("optimizer.muon_momentum", FIELD(optimizer.muon_momentum), half_open(0, 1),
                         "Muon's momentum"));
  s.push_back(bool_key("optimizer.muon_nesterov", FIELD(optimizer.muon_nesterov),
                       "Muon's Nesterov momentum (the update is G + momentum·B, else B)"));
  s.push_back(integer_key("optimizer.muon_ns_steps", FIELD(optimizer.muon_ns_steps), closed(1, 100),
                          "Newton-Schulz iterations of Muon's orthogonalisation"));
  // [lr_scheduler]
  s.push_back(integer_key("lr_scheduler.warmup_steps", FIELD(lr_scheduler.warmup_steps),
                          at_least(0), "linear warmup steps from 0 to optimizer.lr"));
  s.push_back(choice_key("lr_scheduler.decay", FIELD(lr_scheduler.decay), kLrDecayNames,
                         "after warmup, towards min_lr_ratio * lr at the last step: cosine, "
                         "linear or constant"));
  s.push_back(number_key("lr_scheduler.min_lr_ratio", FIELD(lr_scheduler.min_lr_ratio),
                         closed(0, 1), "final learning rate as a fraction of optimizer.lr"));
  add_run_keys(s);
  add_parallel_keys(s);
  return s;
}
#undef FIELD

}  // namespace config_keys

}  // namespace bottle
