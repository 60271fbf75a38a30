// Reading a training configuration: the TOML file and --set overrides through the schema
// (train/config_key.h), with a suggestion for an unknown key; defaults that depend on other
// keys; the checks across keys; and what is written from a configuration (the resolved TOML,
// --help-config, the first difference between two).
#include <toml++/toml.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <set>

#include "core/arena.h"
#include "core/error.h"
#include "io/file_read.h"
#include "model/llama.h"
#include "train/config_key.h"
#include "train/memory_plan.h"
#include "train/train_config.h"

namespace bottle {

namespace config_keys {

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

}  // namespace config_keys

// The schema's types and operations, for this file's parsing and writing.
using namespace config_keys;

namespace {

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
    case KeyType::paths:
      if (const auto* v = node.as_string())
        return v->get().empty() ? std::vector<std::string>{} : std::vector<std::string>{v->get()};
      if (const auto* a = node.as_array()) {
        std::vector<std::string> paths;
        for (const toml::node& item : *a) {
          const auto* v = item.as_string();
          if (!v)
            fail("{}: key '{}' must be {}; item {} is {}", source, key.path, type_noun(key.type),
                 paths.size() + 1, toml_type_name(item));
          paths.push_back(v->get());
        }
        return paths;
      }
      break;
    case KeyType::numbers:
      if (const auto* a = node.as_array()) {
        std::vector<double> numbers;
        for (const toml::node& item : *a) {
          if (const auto* v = item.as_floating_point())
            numbers.push_back(v->get());
          else if (const auto* i = item.as_integer())
            numbers.push_back(double(i->get()));
          else
            fail("{}: key '{}' must be {}; item {} is {}", source, key.path, type_noun(key.type),
                 numbers.size() + 1, toml_type_name(item));
        }
        return numbers;
      }
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
    case KeyType::paths:
    case KeyType::numbers:
      // An array as TOML writes it (--set 'data.train=["a", "b"]'); one path may be bare.
      if (raw.starts_with('[')) {
        toml::table parsed;
        try {
          parsed = toml::parse("value = " + raw);
        } catch (const toml::parse_error&) {
          return std::nullopt;
        }
        return value_from_node(key, *parsed.get("value"), "--set");
      }
      if (key.type == KeyType::numbers) return std::nullopt;
      if (const std::string one = unquote(raw); !one.empty())
        return Value(std::vector<std::string>{one});
      return Value(std::vector<std::string>{});
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

// A mixture names each source once and gives each one weight: a weight given is one per
// source (an empty list is not "unset"), and each source's share is one the run's first lines
// print as more than 0.0 %, as a weight of 0 is refused.
void check_data_sources(const DataConfig& data, const std::string& source, bool weights_given) {
  for (size_t i = 0; i < data.train.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      BOTTLE_CHECK(data.train[i] != data.train[j],
                   "{}: key 'data.train' lists {} twice (sources {} and {}); give a source "
                   "more weight in data.weights instead",
                   source, toml_string(data.train[i]), j + 1, i + 1);
  BOTTLE_CHECK(!weights_given || !data.weights.empty(),
               "{}: key 'data.weights' is an empty list; give one weight per data.train source, "
               "or omit the key for shares by each source's size",
               source);
  BOTTLE_CHECK(data.weights.empty() || data.weights.size() == data.train.size(),
               "{}: key 'data.weights' holds {} weight(s) for {} data.train source(s); give one "
               "per source, in data.train's order",
               source, data.weights.size(), data.train.size());
  double sum = 0.0;
  for (const double w : data.weights) sum += w;
  for (size_t i = 0; i < data.weights.size(); ++i)
    BOTTLE_CHECK(data.weights[i] / sum * 100.0 >= 0.05,
                 "{}: key 'data.weights' gives source {} ({}) a weight of {} in a total of {}: a "
                 "share of {:.2g} %, which prints as 0.0 %; give it a larger weight or remove the "
                 "source",
                 source, i + 1, toml_string(data.train[i]), data.weights[i], sum,
                 data.weights[i] / sum * 100.0);
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
    if (!given.count("parallel.tp_mode")) config.parallel.tp_mode = &default_tp_layout(m.shape());
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
    const std::string overlap_refused = tp_overlap_refusal(config);
    BOTTLE_CHECK(overlap_refused.empty(), "{}: key 'parallel.tp_overlap' {}", source,
                 overlap_refused);
    const std::string schedule_refused = schedule_refusal(config);
    BOTTLE_CHECK(schedule_refused.empty(), "{}: {}", source, schedule_refused);
    check_data_sources(config.data, source, given.count("data.weights") > 0);
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
  defaults.parallel.tp_mode = &default_tp_layout(config.model.shape());
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

std::string config_value_text(const TrainConfig& config, const std::string& path) {
  const ConfigKey* key = find_key(path);
  BOTTLE_ASSERT(key, "config_value_text: no key '{}'", path);
  return format_value(*key, key->get(config));
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
