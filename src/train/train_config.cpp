#include "train/train_config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <type_traits>
#include <variant>

#include "core/error.h"
#include "core/file_read.h"
#include "data/utf8.h"
#include "model/llama.h"
#include "parallel/tp_layouts.h"
#include "train/memory_plan.h"

namespace bottle {

namespace {

constexpr std::array<const char*, 2> kPrecisionNames = {"fp32", "bf16"};
constexpr std::array<const char*, 3> kBackendNames = {"cpu", "reference", "cuda"};
constexpr std::array<const char*, 3> kCommNames = {"auto", "mpi", "nccl"};
// AttentionChoice's order (core/backend_options.h).
constexpr std::array<const char*, 3> kAttentionNames = {"auto", "cudnn", "own"};
constexpr std::array<const char*, 2> kOnNonfiniteNames = {"stop", "skip"};
constexpr std::array<const char*, 3> kLrDecayNames = {"cosine", "linear", "constant"};
constexpr std::array<const char*, 2> kScheduleNames = {"1f1b", "gpipe"};

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
const char* enum_name(LrDecay value) { return kLrDecayNames[int(value)]; }
const char* enum_name(PipelineSchedule value) { return kScheduleNames[int(value)]; }

const TpLayout* default_tp_mode(const ModelConfig& model) {
  return &default_tp_layout(model.shape());
}

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

namespace {

// ---------------------------------------------------------------------------------------
// The schema.

// monostate: an optional key without a value (omitted from the TOML).
using Value = std::variant<std::monostate, int64_t, double, bool, std::string>;

enum class KeyType { integer, number, boolean, string, choice, bytes };

struct Bound {
  double value;
  bool inclusive;
};
struct Range {
  std::optional<Bound> lo, hi;
};
Range greater(double v) { return {Bound{v, false}, std::nullopt}; }
Range at_least(double v) { return {Bound{v, true}, std::nullopt}; }
Range closed(double a, double b) { return {Bound{a, true}, Bound{b, true}}; }
Range half_open(double a, double b) { return {Bound{a, true}, Bound{b, false}}; }

struct ConfigKey {
  std::string path;  // "section.key"
  KeyType type = KeyType::integer;
  Range range;
  std::vector<std::string> choices;  // KeyType::choice
  int64_t int_min = 0, int_max = 0;  // what the C++ field holds (KeyType::integer)
  bool single = false;               // a float field: printed at float precision
  bool optional = false;             // may have no value
  std::string doc;
  std::string default_note;  // shown instead of the default value when not empty
  std::function<Value(const TrainConfig&)> get;
  std::function<void(TrainConfig&, const Value&)> set;
};

// `field` is a generic lambda returning a reference to the member: [](auto& c) -> auto& {...}.
template <typename F>
using FieldType = std::remove_cvref_t<decltype(std::declval<F>()(std::declval<TrainConfig&>()))>;

template <typename F>
ConfigKey integer_key(std::string path, F field, Range range, std::string doc,
                      std::string default_note = {}) {
  using T = FieldType<F>;
  static_assert(std::is_integral_v<T>);
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::integer;
  k.range = range;
  k.int_min = std::numeric_limits<T>::min();
  k.int_max = std::numeric_limits<T>::max();
  k.doc = std::move(doc);
  k.default_note = std::move(default_note);
  k.get = [field](const TrainConfig& c) -> Value { return int64_t(field(c)); };
  k.set = [field](TrainConfig& c, const Value& v) { field(c) = T(std::get<int64_t>(v)); };
  return k;
}

// An integer that is unset when 0 (model.rank, model.ranks.*): given values must be > 0.
template <typename F>
ConfigKey unset_when_zero_key(std::string path, F field, std::string doc,
                              std::string default_note) {
  ConfigKey k =
      integer_key(std::move(path), field, greater(0), std::move(doc), std::move(default_note));
  k.optional = true;
  k.get = [field](const TrainConfig& c) -> Value {
    if (field(c) == 0) return std::monostate{};
    return int64_t(field(c));
  };
  return k;
}

template <typename F>
ConfigKey number_key(std::string path, F field, Range range, std::string doc) {
  using T = FieldType<F>;
  static_assert(std::is_floating_point_v<T>);
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::number;
  k.range = range;
  k.single = std::is_same_v<T, float>;
  k.doc = std::move(doc);
  k.get = [field](const TrainConfig& c) -> Value { return double(field(c)); };
  k.set = [field](TrainConfig& c, const Value& v) { field(c) = T(std::get<double>(v)); };
  return k;
}

template <typename F>
ConfigKey bool_key(std::string path, F field, std::string doc) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::boolean;
  k.doc = std::move(doc);
  k.get = [field](const TrainConfig& c) -> Value { return bool(field(c)); };
  k.set = [field](TrainConfig& c, const Value& v) { field(c) = std::get<bool>(v); };
  return k;
}

template <typename F>
ConfigKey optional_bool_key(std::string path, F field, std::string doc, std::string default_note) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::boolean;
  k.optional = true;
  k.doc = std::move(doc);
  k.default_note = std::move(default_note);
  k.get = [field](const TrainConfig& c) -> Value {
    if (!field(c).has_value()) return std::monostate{};
    return *field(c);
  };
  k.set = [field](TrainConfig& c, const Value& v) { field(c) = std::get<bool>(v); };
  return k;
}

template <typename F>
ConfigKey string_key(std::string path, F field, std::string doc) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::string;
  k.doc = std::move(doc);
  k.get = [field](const TrainConfig& c) -> Value { return std::string(field(c)); };
  k.set = [field](TrainConfig& c, const Value& v) { field(c) = std::get<std::string>(v); };
  return k;
}

// A byte count: a TOML integer, or a string with a unit ("20GiB"); unset when 0.
template <typename F>
ConfigKey bytes_key(std::string path, F field, std::string doc, std::string default_note) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::bytes;
  k.optional = true;
  k.doc = std::move(doc);
  k.default_note = std::move(default_note);
  k.get = [field](const TrainConfig& c) -> Value {
    if (field(c) == 0) return std::monostate{};
    return int64_t(field(c));
  };
  k.set = [field](TrainConfig& c, const Value& v) { field(c) = std::get<int64_t>(v); };
  return k;
}

// An enum stored in `field`, spelled names[int(value)] in TOML.
template <typename F, size_t N>
ConfigKey choice_key(std::string path, F field, const std::array<const char*, N>& names,
                     std::string doc, std::string default_note = {}) {
  using E = FieldType<F>;
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::choice;
  k.choices.assign(names.begin(), names.end());
  k.doc = std::move(doc);
  k.default_note = std::move(default_note);
  k.get = [field, names](const TrainConfig& c) -> Value {
    return std::string(names[size_t(field(c))]);
  };
  k.set = [field, names](TrainConfig& c, const Value& v) {
    const auto& s = std::get<std::string>(v);
    for (size_t i = 0; i < N; ++i)
      if (s == names[i]) field(c) = E(i);
  };
  return k;
}

// parallel.tp_mode: a TP mode's layout, spelled by its name; the choices are the registered
// modes (parallel/tp_layouts.h). Unset (null) until the configuration is resolved.
ConfigKey tp_mode_key(std::string path, std::string doc, std::string default_note) {
  ConfigKey k;
  k.path = std::move(path);
  k.type = KeyType::choice;
  for (const char* name : tp_mode_names()) k.choices.emplace_back(name);
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

// A reference to a member of TrainConfig, for a const or non-const config.
#define FIELD(member) \
  [](auto& c) -> auto& { return c.member; }

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
  s.push_back(choice_key("training.attention", FIELD(training.attention), kAttentionNames,
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
  s.push_back(
      number_key("optimizer.lr", FIELD(optimizer.lr), greater(0), "peak learning rate (AdamW)"));
  s.push_back(number_key("optimizer.weight_decay", FIELD(optimizer.weight_decay), at_least(0),
                         "decoupled weight decay (not on norms and embeddings)"));
  s.push_back(number_key(
      "optimizer.beta1", [](auto& c) -> auto& { return c.optimizer.beta1; }, half_open(0, 1),
      "AdamW first-moment decay"));
  s.push_back(number_key(
      "optimizer.beta2", [](auto& c) -> auto& { return c.optimizer.beta2; }, half_open(0, 1),
      "AdamW second-moment decay"));
  s.push_back(number_key("optimizer.eps", FIELD(optimizer.eps), greater(0), "AdamW epsilon"));
  // [lr_scheduler]
  s.push_back(integer_key("lr_scheduler.warmup_steps", FIELD(lr_scheduler.warmup_steps),
                          at_least(0), "linear warmup steps from 0 to optimizer.lr"));
  s.push_back(choice_key("lr_scheduler.decay", FIELD(lr_scheduler.decay), kLrDecayNames,
                         "after warmup, towards min_lr_ratio * lr at the last step: cosine, "
                         "linear or constant"));
  s.push_back(number_key("lr_scheduler.min_lr_ratio", FIELD(lr_scheduler.min_lr_ratio),
                         closed(0, 1), "final learning rate as a fraction of optimizer.lr"));
  // [data]
  s.push_back(string_key("data.train", FIELD(data.train),
                         "training tokens: a shard file, a directory or a glob (required to "
                         "train)"));
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
  // [metrics]
  s.push_back(integer_key("metrics.log_freq", FIELD(metrics.log_freq), greater(0),
                          "steps between printed log lines (metrics.jsonl records every step)"));
  s.push_back(string_key("metrics.jsonl", FIELD(metrics.jsonl),
                         "per-step metrics, one JSON object a line (relative to "
                         "checkpoint.folder)"));
  s.push_back(string_key("metrics.plot", FIELD(metrics.plot),
                         "loss curve image (relative to checkpoint.folder)"));
  // [parallel]
  s.push_back(integer_key("parallel.tp", FIELD(parallel.tp), greater(0), "tensor-parallel ranks"));
  s.push_back(integer_key("parallel.pp", FIELD(parallel.pp), greater(0), "pipeline stages"));
  s.push_back(integer_key("parallel.dp", FIELD(parallel.dp), greater(0), "data-parallel ranks"));
  s.push_back(tp_mode_key("parallel.tp_mode",
                          "full (Megatron TP, full-rank model), vanilla (Megatron TP on a "
                          "bottleneck model), btp (bottleneck-aware TP)",
                          "full for a full-rank model, btp for a bottleneck model"));
  s.push_back(choice_key("parallel.schedule", FIELD(parallel.schedule), kScheduleNames,
                         "pipeline schedule: 1f1b or gpipe"));
  s.push_back(integer_key("parallel.zero", FIELD(parallel.zero), closed(0, 1),
                          "ZeRO stage: 0 (replicated AdamW state) or 1 (sharded)"));
  s.push_back(bool_key("parallel.grouping", FIELD(parallel.grouping),
                       "one GEMM for projections reading the same input (q,k,v; gate,up)"));
  s.push_back(choice_key("parallel.comm", FIELD(parallel.comm), kCommNames,
                         "collectives of the TP, PP and DP groups: nccl (GPU memory, one rank "
                         "per GPU), mpi (host memory; with cuda, staged through the host so "
                         "ranks may share a GPU) or auto (nccl on cuda, else mpi)"));
  return s;
}
#undef FIELD

const std::vector<ConfigKey>& schema() {
  static const std::vector<ConfigKey> keys = [] {
    auto k = build_schema();
    std::set<std::string> seen;
    for (const auto& key : k)
      if (!seen.insert(key.path).second) std::abort();  // a key listed twice
    // Every setting that code below src/train may name is a key of the schema.
    for (int i = 0; i <= int(Setting::bottleneck); ++i)
      if (!seen.count(config_key(Setting(i)))) std::abort();
    return k;
  }();
  return keys;
}

const ConfigKey* find_key(const std::string& path) {
  for (const auto& k : schema())
    if (k.path == path) return &k;
  return nullptr;
}

// "model", "training", ..., "model.ranks": the tables keys live in.
bool is_known_table(const std::string& path) {
  for (const auto& k : schema())
    if (k.path.size() > path.size() && k.path.compare(0, path.size(), path) == 0 &&
        k.path[path.size()] == '.')
      return true;
  return false;
}

// ---------------------------------------------------------------------------------------
// Values: formatting, checks, conversions.

std::string format_number(double v, bool single) {
  std::string s = single ? fmt::format("{}", float(v)) : fmt::format("{}", v);
  if (s == "inf" || s == "-inf" || s == "nan" || s == "-nan") return s;
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

std::string toml_string(const std::string& s) {
  std::string out = "\"";
  for (const char ch : s) {
    const auto u = static_cast<unsigned char>(ch);
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (u < 0x20 || u == 0x7f)
          out += fmt::format("\\u{:04X}", unsigned(u));
        else
          out += ch;
    }
  }
  return out + "\"";
}

std::string format_value(const ConfigKey& key, const Value& v) {
  if (std::holds_alternative<std::monostate>(v)) return "unset";
  if (const auto* i = std::get_if<int64_t>(&v)) return fmt::format("{}", *i);
  if (const auto* d = std::get_if<double>(&v)) return format_number(*d, key.single);
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "true" : "false";
  return toml_string(std::get<std::string>(v));
}

std::string describe_range(const Range& r) {
  auto num = [](double v) { return fmt::format("{}", v); };
  if (r.lo && r.hi)
    return fmt::format("in {}{}, {}{}", r.lo->inclusive ? '[' : '(', num(r.lo->value),
                       num(r.hi->value), r.hi->inclusive ? ']' : ')');
  if (r.lo) return fmt::format("{} {}", r.lo->inclusive ? ">=" : ">", num(r.lo->value));
  if (r.hi) return fmt::format("{} {}", r.hi->inclusive ? "<=" : "<", num(r.hi->value));
  return "any";
}

bool in_range(const Range& r, double v) {
  if (std::isnan(v)) return !r.lo && !r.hi;
  if (r.lo && !(r.lo->inclusive ? v >= r.lo->value : v > r.lo->value)) return false;
  if (r.hi && !(r.hi->inclusive ? v <= r.hi->value : v < r.hi->value)) return false;
  return true;
}

const char* type_noun(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "an integer";
    case KeyType::number:
      return "a number";
    case KeyType::boolean:
      return "a boolean";
    case KeyType::bytes:
      return "a byte size (an integer, or a string such as \"20GiB\")";
    default:
      return "a string";
  }
}

const char* type_word(KeyType t) {
  switch (t) {
    case KeyType::integer:
      return "integer";
    case KeyType::number:
      return "number";
    case KeyType::boolean:
      return "boolean";
    case KeyType::string:
      return "string";
    case KeyType::bytes:
      return "bytes";
    default:
      return "choice";
  }
}

std::string quoted_choices(const ConfigKey& key) {
  std::string out;
  for (size_t i = 0; i < key.choices.size(); ++i)
    out += (i ? ", \"" : "\"") + key.choices[i] + "\"";
  return out;
}

// Range and choice checks, then stores the value. `source`: the file or "--set".
void assign(TrainConfig& config, const ConfigKey& key, const Value& value,
            const std::string& source) {
  switch (key.type) {
    case KeyType::integer: {
      const int64_t v = std::get<int64_t>(value);
      if (!in_range(key.range, double(v)))
        fail("{}: key '{}' must be {}, got {}", source, key.path, describe_range(key.range), v);
      if (v < key.int_min || v > key.int_max)
        fail("{}: key '{}' is too large, got {}", source, key.path, v);
      break;
    }
    case KeyType::number: {
      const double v = std::get<double>(value);
      if (!in_range(key.range, v) || !std::isfinite(v))
        fail("{}: key '{}' must be {}, got {}", source, key.path,
             key.range.lo || key.range.hi ? describe_range(key.range) : std::string("finite"), v);
      if (key.single && !std::isfinite(float(v)))
        fail("{}: key '{}' is too large for a float, got {}", source, key.path, v);
      break;
    }
    case KeyType::bytes: {
      // 0 once meant "no limit" and was replaced silently; an absent key says that now.
      const int64_t v = std::get<int64_t>(value);
      if (v <= 0)
        fail("{}: key '{}' must be a positive byte size (omit the key for no limit), got {}",
             source, key.path, v);
      break;
    }
    case KeyType::string:
      // Paths and names travel into JSON (trainer_state.json), gnuplot's script and one-line
      // messages: a byte that is not UTF-8 or a control character would fail there, after the
      // whole run; refused here, where it enters.
      if (const std::string why = text_value_problem(std::get<std::string>(value)); !why.empty())
        fail(
            "{}: key '{}' holds {}; paths and names must be UTF-8 text without control "
            "characters",
            source, key.path, why);
      break;
    case KeyType::choice: {
      const auto& s = std::get<std::string>(value);
      if (std::find(key.choices.begin(), key.choices.end(), s) == key.choices.end())
        fail("{}: key '{}' must be one of {}; got {}", source, key.path, quoted_choices(key),
             toml_string(s));
      break;
    }
    default:
      break;
  }
  key.set(config, value);
}

const char* toml_type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table:
      return "table";
    case toml::node_type::array:
      return "array";
    case toml::node_type::string:
      return "string";
    case toml::node_type::integer:
      return "integer";
    case toml::node_type::floating_point:
      return "float";
    case toml::node_type::boolean:
      return "boolean";
    case toml::node_type::date:
      return "date";
    case toml::node_type::time:
      return "time";
    case toml::node_type::date_time:
      return "date-time";
    default:
      return "nothing";
  }
}

Value value_from_node(const ConfigKey& key, const toml::node& node, const std::string& source) {
  switch (key.type) {
    case KeyType::integer:
      if (const auto* v = node.as_integer()) return v->get();
      break;
    case KeyType::number:
      if (const auto* v = node.as_floating_point()) return v->get();
      if (const auto* v = node.as_integer()) return double(v->get());
      break;
    case KeyType::boolean:
      if (const auto* v = node.as_boolean()) return v->get();
      break;
    case KeyType::string:
    case KeyType::choice:
      if (const auto* v = node.as_string()) return v->get();
      break;
    case KeyType::bytes:
      if (const auto* v = node.as_integer(); v && v->get() >= 0) return v->get();
      if (const auto* v = node.as_string())
        if (const auto bytes = parse_byte_size(v->get())) return *bytes;
      break;
  }
  fail("{}: key '{}' must be {}, got {}", source, key.path, type_noun(key.type),
       toml_type_name(node));
}

std::string trim(std::string s) {
  const auto first = s.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  const auto last = s.find_last_not_of(" \t");
  return s.substr(first, last - first + 1);
}

std::string unquote(const std::string& s) {
  if (s.size() >= 2 && (s.front() == '"' || s.front() == '\'') && s.back() == s.front())
    return s.substr(1, s.size() - 2);
  return s;
}

// A --set value, read by the key's type; nullopt when it does not parse.
std::optional<Value> value_from_text(const ConfigKey& key, const std::string& raw) {
  switch (key.type) {
    case KeyType::integer: {
      std::string s = raw;
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      if (!s.empty() && s[0] == '+') s.erase(0, 1);
      int64_t v = 0;
      const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
      if (s.empty() || ec != std::errc() || end != s.data() + s.size()) return std::nullopt;
      return v;
    }
    case KeyType::number: {
      std::string s = raw;
      s.erase(std::remove(s.begin(), s.end(), '_'), s.end());
      if (s.empty()) return std::nullopt;
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      if (end != s.c_str() + s.size()) return std::nullopt;
      return v;
    }
    case KeyType::boolean:
      if (raw == "true") return true;
      if (raw == "false") return false;
      return std::nullopt;
    case KeyType::bytes:
      if (const auto bytes = parse_byte_size(unquote(raw))) return Value(*bytes);
      return std::nullopt;
    default:
      return unquote(raw);
  }
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
      diagonal = up;
    }
  }
  return row[b.size()];
}

std::string leaf(const std::string& path) {
  const auto dot = path.find('.');
  return dot == std::string::npos ? path : path.substr(dot + 1);
}

// " (did you mean 'training.steps'?)" or "".
std::string suggestion(const std::string& path) {
  const ConfigKey* best = nullptr;
  size_t best_distance = 3;
  for (const auto& k : schema()) {
    const size_t d = edit_distance(path, k.path);
    if (d < best_distance) best = &k, best_distance = d;
  }
  if (!best)  // the right key in the wrong section
    for (const auto& k : schema())
      if (leaf(k.path) == leaf(path) || leaf(k.path) == path) {
        best = &k;
        break;
      }
  return best ? fmt::format(" (did you mean '{}'?)", best->path) : std::string();
}

[[noreturn]] void unknown_key(const std::string& source, const std::string& path) {
  fail("{}: unknown key '{}'{}", source, path, suggestion(path));
}

// ---------------------------------------------------------------------------------------
// Parsing.

struct Loader {
  std::string source;
  TrainConfig config;
  std::set<std::string> given;  // keys set by the file or --set
  ConfigKeysGiven sources;      // the same, by source

  void walk(const toml::table& table, const std::string& prefix) {
    // In file order, so that the first error reported is the first in the file.
    std::vector<std::pair<std::string, const toml::node*>> entries;
    for (auto&& [k, node] : table) entries.emplace_back(std::string(k.str()), &node);
    std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) {
      const auto &sa = a.second->source().begin, &sb = b.second->source().begin;
      return sa.line != sb.line ? sa.line < sb.line : sa.column < sb.column;
    });
    for (const auto& [name, node] : entries) {
      const std::string path = prefix.empty() ? name : prefix + "." + name;
      if (const ConfigKey* key = find_key(path)) {
        assign(config, *key, value_from_node(*key, *node, source), source);
        given.insert(path);
        sources.file.insert(path);
      } else if (is_known_table(path)) {
        const auto* sub = node->as_table();
        if (!sub) fail("{}: key '{}' must be a table, got {}", source, path, toml_type_name(*node));
        walk(*sub, path);
      } else if (const auto* sub = node->as_table(); sub && !sub->empty()) {
        walk(*sub, path);  // an unknown table: reports its first key
      } else {
        unknown_key(source, path);
      }
    }
  }

  void apply_override(const std::string& text) {
    const auto eq = text.find('=');
    if (eq == std::string::npos || trim(text.substr(0, eq)).empty())
      fail("--set: malformed override '{}' (expected section.key=value)", text);
    const std::string path = trim(text.substr(0, eq));
    const std::string raw = trim(text.substr(eq + 1));
    const ConfigKey* key = find_key(path);
    if (!key) {
      if (is_known_table(path))
        fail("--set: '{}' is a table; set its keys one at a time ('{}.KEY=VALUE')", path, path);
      unknown_key("--set", path);
    }
    const auto value = value_from_text(*key, raw);
    if (!value) fail("--set: key '{}' must be {}, got '{}'", path, type_noun(key->type), raw);
    assign(config, *key, *value, "--set");
    given.insert(path);
    sources.set.insert(path);
  }

  void resolve_and_validate() {
    auto& m = config.model;
    const auto& p = config.parallel;
    if (!given.count("model.num_kv_heads")) m.num_kv_heads = m.num_heads;
    if (!given.count("parallel.tp_mode")) config.parallel.tp_mode = default_tp_mode(m);
    m.validate(source, false);
    BOTTLE_CHECK(config.training.seq_len <= m.max_seq_len,
                 "{}: key 'training.seq_len' must be <= model.max_seq_len ({}), got {}", source,
                 m.max_seq_len, config.training.seq_len);
    // The layout, recomputation and pipeline checks of src/parallel and src/model, which name
    // settings by their keys here.
    try {
      validate_layout(*p.tp_mode, m.shape(), int(p.tp));
      validate_recompute(config.training.recompute, *p.tp_mode, m.shape());
      validate_pipeline_stages(p.pp, m.num_layers);
    } catch (const SettingError& e) {
      fail("{}", describe_setting_error(e, source));
    }
    const auto& t = config.training;
    BOTTLE_CHECK(p.comm != CommKind::nccl || t.backend == BackendKind::cuda,
                 "{}: key 'parallel.comm' = \"nccl\" moves GPU memory: it needs "
                 "training.backend = \"cuda\", not \"{}\"",
                 source, enum_name(t.backend));
    BOTTLE_CHECK(t.attention != AttentionChoice::cudnn || t.backend == BackendKind::cuda,
                 "{}: key 'training.attention' = \"cudnn\" is cuDNN's attention on the GPU: it "
                 "needs training.backend = \"cuda\", not \"{}\" (choose \"auto\" or \"own\")",
                 source, enum_name(t.backend));
    check_batch_shape(m, t.micro_batch_size, t.seq_len, source + ": key",
                      "'training.micro_batch_size'", "'training.seq_len'");
    // Tokens per step (b·s·accum·dp) count the whole job's work: they must fit too.
    int64_t tokens = 0;
    BOTTLE_CHECK(
        !__builtin_mul_overflow(t.micro_batch_size * t.seq_len, t.grad_accum_steps, &tokens) &&
            !__builtin_mul_overflow(tokens, p.dp, &tokens),
        "{}: key 'training.grad_accum_steps' ({}) x training.micro_batch_size ({}) x "
        "training.seq_len ({}) x parallel.dp ({}) tokens per step overflow 64 bits",
        source, t.grad_accum_steps, t.micro_batch_size, t.seq_len, p.dp);
  }
};

}  // namespace

TrainConfig parse_train_config_string(const std::string& toml_text, const std::string& source_name,
                                      const std::vector<std::string>& overrides,
                                      ConfigKeysGiven* given) {
  Loader loader;
  loader.source = source_name;
  toml::table table;
  try {
    table = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    fail("{}: TOML syntax error at line {}, column {}: {}", source_name, e.source().begin.line,
         e.source().begin.column, e.description());
  }
  loader.walk(table, "");
  for (const auto& text : overrides) loader.apply_override(text);
  loader.resolve_and_validate();
  if (given) *given = loader.sources;
  return loader.config;
}

TrainConfig apply_config_overrides(const ModelConfig& model,
                                   const std::vector<std::string>& overrides,
                                   ConfigKeysGiven* given) {
  Loader loader;
  loader.source = "--set";
  loader.config.model = model;
  // The model is given whole: nothing of it is resolved from defaults.
  for (const auto& key : schema())
    if (key.path.starts_with("model.")) loader.given.insert(key.path);
  // The default sequence length must not be what makes a short model invalid.
  loader.config.training.seq_len = std::min(loader.config.training.seq_len, model.max_seq_len);
  for (const auto& text : overrides) loader.apply_override(text);
  loader.resolve_and_validate();
  if (given) *given = loader.sources;
  return loader.config;
}

void check_honoured_keys(const TrainConfig& config, const ConfigKeysGiven& given,
                         const std::string& source, const CommandKeys& keys) {
  auto listed = [](const std::vector<std::string>& list, const std::string& path) {
    return std::any_of(list.begin(), list.end(), [&](const std::string& entry) {
      return entry.ends_with('.') ? path.starts_with(entry) : path == entry;
    });
  };
  for (const auto& key : schema())
    if (given.set.count(key.path) && !listed(keys.honoured, key.path))
      fail("--set: {} does not read key '{}': {}", keys.command, key.path, keys.reason);
  // Defaults as resolution gives them for this model.
  TrainConfig defaults;
  defaults.model.num_kv_heads = config.model.num_heads;
  defaults.parallel.tp_mode = default_tp_mode(config.model);
  for (const auto& key : schema()) {
    if (!given.file.count(key.path) || listed(keys.honoured, key.path) ||
        listed(keys.run_keys, key.path))
      continue;
    const Value value = key.get(config);
    if (value != key.get(defaults))
      fail("{}: {} does not read key '{}' (set to {}; its default is {}): {}", source, keys.command,
           key.path, format_value(key, value), format_value(key, key.get(defaults)), keys.reason);
  }
}

TrainConfig load_train_config(const std::string& path, const std::vector<std::string>& overrides,
                              ConfigKeysGiven* given) {
  // A FIFO or a device would block or never end.
  std::error_code ec;
  BOTTLE_CHECK(!std::filesystem::exists(path, ec) || std::filesystem::is_regular_file(path, ec),
               "{}: the configuration file is not a regular file (a FIFO, device or directory)",
               path);
  return parse_train_config_string(
      read_bounded_file(path, "the configuration file", kMaxConfigFileBytes), path, overrides,
      given);
}

std::string config_difference(const TrainConfig& a, const TrainConfig& b) {
  for (const auto& key : schema()) {
    const Value va = key.get(a), vb = key.get(b);
    if (va != vb)
      return fmt::format("{}: {} vs {}", key.path, format_value(key, va), format_value(key, vb));
  }
  return {};
}

std::string to_toml(const TrainConfig& config) {
  std::string out = "# bottle training configuration (every key resolved)\n";
  std::string section;
  std::string ranks;  // model.ranks.* collected into one inline table
  auto flush_ranks = [&] {
    if (!ranks.empty()) out += fmt::format("ranks = {{ {} }}\n", ranks);
    ranks.clear();
  };
  for (const auto& key : schema()) {
    const auto dot = key.path.find('.');
    const std::string sec = key.path.substr(0, dot);
    std::string name = key.path.substr(dot + 1);
    if (sec != section) {
      flush_ranks();
      out += fmt::format("\n[{}]\n", sec);
      section = sec;
    }
    const Value v = key.get(config);
    if (name.rfind("ranks.", 0) == 0) {
      if (!std::holds_alternative<std::monostate>(v))
        ranks += fmt::format("{}{} = {}", ranks.empty() ? "" : ", ", name.substr(6),
                             format_value(key, v));
      continue;
    }
    flush_ranks();
    if (std::holds_alternative<std::monostate>(v))
      out += fmt::format("# {}: unset (default: {})\n", name, key.default_note);
    else
      out += fmt::format("{} = {}\n", name, format_value(key, v));
  }
  flush_ranks();
  return out;
}

std::string describe_config_keys() {
  const TrainConfig defaults;
  std::string out;
  std::string section;
  for (const auto& key : schema()) {
    const std::string sec = key.path.substr(0, key.path.find('.'));
    if (sec != section) {
      out += fmt::format("{}[{}]\n", section.empty() ? "" : "\n", sec);
      section = sec;
    }
    std::string type = type_word(key.type);
    if (key.type == KeyType::choice) type = quoted_choices(key);
    if ((key.type == KeyType::integer || key.type == KeyType::number) &&
        (key.range.lo || key.range.hi))
      type += ", " + describe_range(key.range);
    if (key.default_note.empty())
      out += fmt::format("  {} = {}  ({})\n", key.path, format_value(key, key.get(defaults)), type);
    else
      out += fmt::format("  {}  ({}; default: {})\n", key.path, type, key.default_note);
    out += fmt::format("      {}\n", key.doc);
  }
  return out;
}

}  // namespace bottle
