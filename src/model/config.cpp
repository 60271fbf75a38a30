#include "model/config.h"

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>
#include <type_traits>

#include "core/json_bounded.h"

namespace bottle {

int64_t ModelConfig::rank_of(ProjectionId p) const {
  if (ranks[int(p)] != 0) return ranks[int(p)];
  return rank != 0 ? rank : hidden_size / 4;
}

int64_t ModelConfig::d_in(ProjectionId p) const {
  switch (p) {
    case ProjectionId::o:
      return num_heads * head_dim();
    case ProjectionId::down:
      return intermediate_size;
    default:
      return hidden_size;
  }
}

int64_t ModelConfig::d_out(ProjectionId p) const {
  switch (p) {
    case ProjectionId::q:
      return num_heads * head_dim();
    case ProjectionId::k:
    case ProjectionId::v:
      return num_kv_heads * head_dim();
    case ProjectionId::gate:
    case ProjectionId::up:
      return intermediate_size;
    default:
      return hidden_size;
  }
}

int64_t ModelConfig::parameter_count() const {
  int64_t per_block = 2 * hidden_size;
  for (int i = 0; i < kNumProjections; ++i) {
    const auto p = ProjectionId(i);
    if (bottleneck == BottleneckKind::none) {
      per_block += d_in(p) * d_out(p);
    } else {
      per_block += rank_of(p) * (d_in(p) + d_out(p));
    }
  }
  int64_t total = per_block * num_layers + hidden_size + vocab_size * hidden_size;
  if (!tie_embeddings) total += vocab_size * hidden_size;
  if (bottleneck == BottleneckKind::lax)
    for (int i = 0; i < kNumProjections; ++i)
      total += (num_layers - 1) *
               (rank_of(ProjectionId(i)) * rank_of(ProjectionId(i)) + 2 * rank_of(ProjectionId(i)));
  return total;
}

void ModelConfig::validate(const std::string& source, bool hf) const {
  auto key = [hf](const char* hf_name, const char* toml_name) { return hf ? hf_name : toml_name; };
  auto positive = [&](int64_t v, const char* hf_name, const char* toml_name) {
    BOTTLE_CHECK(v > 0, "{}: {} must be positive, got {}", source, key(hf_name, toml_name), v);
  };
  positive(vocab_size, "vocab_size", "model.vocab_size");
  positive(hidden_size, "hidden_size", "model.hidden_size");
  positive(intermediate_size, "intermediate_size", "model.intermediate_size");
  positive(num_layers, "num_hidden_layers", "model.num_layers");
  positive(num_heads, "num_attention_heads", "model.num_heads");
  positive(num_kv_heads, "num_key_value_heads", "model.num_kv_heads");
  positive(max_seq_len, "max_position_embeddings", "model.max_seq_len");
  BOTTLE_CHECK(hidden_size % num_heads == 0, "{}: {} ({}) must divide {} ({})", source,
               key("num_attention_heads", "model.num_heads"), num_heads,
               key("hidden_size", "model.hidden_size"), hidden_size);
  BOTTLE_CHECK(head_dim() % 2 == 0, "{}: head width {} = {} / {} must be even for RoPE", source,
               head_dim(), hidden_size, num_heads);
  BOTTLE_CHECK(num_heads % num_kv_heads == 0, "{}: {} ({}) must divide {} ({})", source,
               key("num_key_value_heads", "model.num_kv_heads"), num_kv_heads,
               key("num_attention_heads", "model.num_heads"), num_heads);
  BOTTLE_CHECK(rms_norm_eps > 0.0f, "{}: {} must be positive", source,
               key("rms_norm_eps", "model.rms_norm_eps"));
  BOTTLE_CHECK(rope_theta > 0.0f, "{}: {} must be positive", source,
               key("rope_theta", "model.rope_theta"));
  if (bottleneck == BottleneckKind::none) return;
  for (int i = 0; i < kNumProjections; ++i) {
    const auto p = ProjectionId(i);
    const int64_t r = rank_of(p), limit = std::min(d_in(p), d_out(p));
    BOTTLE_CHECK(
        r > 0 && r <= limit,
        "{}: {} of the {} projection is {}; it must be in [1, {}] (min of its {} inputs and {} "
        "outputs)",
        source,
        ranks[i] ? fmt::format("{}.{}", key("bottleneck.ranks", "model.ranks"), kProjectionNames[i])
                 : std::string(key("bottleneck.rank", "model.rank")),
        kProjectionNames[i], r, limit, d_in(p), d_out(p));
  }
}

std::string model_config_difference(const ModelConfig& a, const ModelConfig& b) {
  auto differ = [](const char* key, const auto& x, const auto& y) {
    return x == y ? std::string() : fmt::format("{}: {} vs {}", key, x, y);
  };
  for (const std::string& d :
       {differ("vocab_size", a.vocab_size, b.vocab_size),
        differ("hidden_size", a.hidden_size, b.hidden_size),
        differ("intermediate_size", a.intermediate_size, b.intermediate_size),
        differ("num_hidden_layers", a.num_layers, b.num_layers),
        differ("num_attention_heads", a.num_heads, b.num_heads),
        differ("num_key_value_heads", a.num_kv_heads, b.num_kv_heads),
        differ("tie_word_embeddings", a.tie_embeddings, b.tie_embeddings),
        differ("bottleneck.kind", bottleneck_kind_name(a.bottleneck),
               bottleneck_kind_name(b.bottleneck)),
        differ("bottleneck.mlp_gate_act", a.gate_act(), b.gate_act()),
        differ("rms_norm_eps", a.rms_norm_eps, b.rms_norm_eps),
        differ("rope_theta", a.rope_theta, b.rope_theta)})
    if (!d.empty()) return d;
  if (a.bottleneck != BottleneckKind::none)
    for (int i = 0; i < kNumProjections; ++i)
      if (a.rank_of(ProjectionId(i)) != b.rank_of(ProjectionId(i)))
        return fmt::format("rank of the {} projection: {} vs {}", kProjectionNames[i],
                           a.rank_of(ProjectionId(i)), b.rank_of(ProjectionId(i)));
  return "";
}

namespace {

template <typename T>
T get(const nlohmann::json& j, const char* name, const std::string& path) {
  BOTTLE_CHECK(j.contains(name), "{}: missing key '{}'", path, name);
  const nlohmann::json& v = j.at(name);
  // nlohmann converts a number to any arithmetic type with a cast, which is undefined for a
  // value out of the type's range (2e19 for an int64_t, 1e300 for a float): check first.
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
    BOTTLE_CHECK(v.is_number_integer() &&
                     (v.is_number_unsigned() ? v.get<uint64_t>() <= uint64_t(INT64_MAX) : true),
                 "{}: key '{}' must be an integer of magnitude below 2^63, got {}", path, name,
                 v.dump());
  } else if constexpr (std::is_floating_point_v<T>) {
    BOTTLE_CHECK(v.is_number() && std::isfinite(v.get<double>()) &&
                     std::abs(v.get<double>()) <= double(std::numeric_limits<T>::max()),
                 "{}: key '{}' must be a finite number of magnitude at most {:g}, got {}", path,
                 name, double(std::numeric_limits<T>::max()), v.dump());
  }
  try {
    return j.at(name).get<T>();
  } catch (const std::exception&) {
    fail("{}: key '{}' has the wrong type ({})", path, name, j.at(name).dump());
  }
}

template <typename T>
T get_or(const nlohmann::json& j, const char* name, T fallback, const std::string& path) {
  return j.contains(name) && !j.at(name).is_null() ? get<T>(j, name, path) : fallback;
}

}  // namespace

ModelConfig read_hf_config(const std::string& path) {
  std::ifstream in(path);
  BOTTLE_CHECK(in, "{}: cannot open", path);
  std::ostringstream text;
  text << in.rdbuf();
  BOTTLE_CHECK(in, "{}: read failed", path);
  return parse_hf_config(text.str(), path);
}

ModelConfig parse_hf_config(std::string_view text, const std::string& path) {
  const nlohmann::json j = parse_json_bounded(text, path);
  BOTTLE_CHECK(j.is_object(), "{}: expected a JSON object", path);
  ModelConfig c;
  c.vocab_size = get<int64_t>(j, "vocab_size", path);
  c.hidden_size = get<int64_t>(j, "hidden_size", path);
  c.intermediate_size = get<int64_t>(j, "intermediate_size", path);
  c.num_layers = get<int64_t>(j, "num_hidden_layers", path);
  c.num_heads = get<int64_t>(j, "num_attention_heads", path);
  c.num_kv_heads = get_or<int64_t>(j, "num_key_value_heads", c.num_heads, path);
  c.max_seq_len = get_or<int64_t>(j, "max_position_embeddings", 2048, path);
  c.rms_norm_eps = get_or<float>(j, "rms_norm_eps", 1e-6f, path);
  c.rope_theta = get_or<float>(j, "rope_theta", 10000.0f, path);
  c.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false, path);
  if (j.contains("bottleneck") && !j["bottleneck"].is_null()) {
    const auto& b = j["bottleneck"];
    const std::string where = path + ": bottleneck";
    BOTTLE_CHECK(b.is_object(), "{}: key 'bottleneck' must be an object", path);
    try {
      c.bottleneck = parse_bottleneck_kind(get<std::string>(b, "kind", where));
    } catch (const Error& e) {
      fail("{}: bottleneck.kind: {}", path, e.what());
    }
    c.rank = get_or<int64_t>(b, "rank", 0, where);
    BOTTLE_CHECK(!b.contains("rank") || c.rank > 0, "{}: bottleneck.rank must be positive, got {}",
                 path, c.rank);
    if (b.contains("ranks")) {
      BOTTLE_CHECK(b["ranks"].is_object(), "{}: key 'bottleneck.ranks' must be an object", path);
      for (auto& [name, value] : b["ranks"].items()) {
        int idx = -1;
        for (int i = 0; i < kNumProjections; ++i)
          if (name == kProjectionNames[i]) idx = i;
        BOTTLE_CHECK(idx >= 0, "{}: unknown projection '{}' in bottleneck.ranks", path, name);
        BOTTLE_CHECK(value.is_number_integer(), "{}: bottleneck.ranks.{} must be an integer", path,
                     name);
        c.ranks[idx] = value.get<int64_t>();
        BOTTLE_CHECK(c.ranks[idx] > 0, "{}: bottleneck.ranks.{} must be positive, got {}", path,
                     name, c.ranks[idx]);
      }
    }
    const std::string act = get_or<std::string>(b, "activation", "silu", where);
    BOTTLE_CHECK(act == "silu", "{}: bottleneck.activation '{}' is not supported (silu)", path,
                 act);
    if (b.contains("mlp_gate_act")) c.mlp_gate_act = get<bool>(b, "mlp_gate_act", where);
  }
  c.validate(path, true);
  return c;
}

void write_hf_config(const ModelConfig& c, const std::string& path) {
  nlohmann::ordered_json j;
  j["architectures"] = {"LlamaForCausalLM"};
  j["model_type"] = "llama";
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  j["rms_norm_eps"] = c.rms_norm_eps;
  j["rope_theta"] = c.rope_theta;
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  j["torch_dtype"] = "float32";
  if (c.bottleneck != BottleneckKind::none) {
    nlohmann::ordered_json b;
    b["kind"] = bottleneck_kind_name(c.bottleneck);
    b["rank"] = c.rank != 0 ? c.rank : c.hidden_size / 4;
    nlohmann::ordered_json ranks = nlohmann::ordered_json::object();
    for (int i = 0; i < kNumProjections; ++i)
      if (c.ranks[i] != 0) ranks[kProjectionNames[i]] = c.ranks[i];
    if (!ranks.empty()) b["ranks"] = ranks;
    b["activation"] = "silu";
    b["mlp_gate_act"] = c.gate_act();
    j["bottleneck"] = b;
  }
  std::ofstream out(path, std::ios::trunc);
  BOTTLE_CHECK(out, "{}: cannot open for writing", path);
  out << j.dump(2) << "\n";
  out.flush();
  BOTTLE_CHECK(out, "{}: write failed", path);
}

}  // namespace bottle
