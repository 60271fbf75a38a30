#include "model/config.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "io/file_read.h"
#include "io/json_io.h"
#include "model/hf_modeling_files.h"

namespace bottle {

int64_t ModelConfig::rank_of(ProjectionId p) const {
  if (ranks[int(p)] != 0) return ranks[int(p)];
  return rank != 0 ? rank : hidden_size / 4;
}

int64_t ModelConfig::d_in(ProjectionId p) const { return shape().d_in(p); }

int64_t ModelConfig::d_out(ProjectionId p) const { return shape().d_out(p); }

ModelShape ModelConfig::shape() const {
  ModelShape s;
  s.vocab = vocab_size;
  s.hidden = hidden_size;
  s.ffn = intermediate_size;
  s.heads = num_heads;
  s.kv_heads = num_kv_heads;
  s.bottleneck = bottleneck;
  if (bottleneck != BottleneckKind::none)
    for (int i = 0; i < kNumProjections; ++i) s.ranks[size_t(i)] = rank_of(ProjectionId(i));
  s.tied_embeddings = tie_embeddings;
  return s;
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
  BOTTLE_CHECK(std::isfinite(rms_norm_eps) && rms_norm_eps > 0.0f,
               "{}: {} must be a positive finite number, got {}", source,
               key("rms_norm_eps", "model.rms_norm_eps"), rms_norm_eps);
  BOTTLE_CHECK(std::isfinite(rope_theta) && rope_theta > 0.0f,
               "{}: {} must be a positive finite number, got {}", source,
               key("rope_theta", "model.rope_theta"), rope_theta);
  // Token ids are 32-bit in shards and kernels.
  BOTTLE_CHECK(vocab_size <= INT32_MAX, "{}: {} must be in [1, {}] (32-bit token ids), got {}",
               source, key("vocab_size", "model.vocab_size"), INT32_MAX, vocab_size);
  // A full-rank model is saved as LlamaForCausalLM, whose MLP applies SiLU to gate.
  BOTTLE_CHECK(bottleneck != BottleneckKind::none || gate_act(),
               "{}: {} = false needs a bottleneck: a full-rank model's MLP is LLaMA's (SiLU on "
               "the gate), which is what its checkpoint says to transformers",
               source, key("bottleneck.mlp_gate_act", "model.mlp_gate_act"));
  if (bottleneck != BottleneckKind::none) {
    for (int i = 0; i < kNumProjections; ++i) {
      const auto p = ProjectionId(i);
      const int64_t r = rank_of(p), limit = std::min(d_in(p), d_out(p));
      BOTTLE_CHECK(
          r > 0 && r <= limit,
          "{}: {} of the {} projection is {}; it must be in [1, {}] (min of its {} inputs and {} "
          "outputs)",
          source,
          ranks[i]
              ? fmt::format("{}.{}", key("bottleneck.ranks", "model.ranks"), kProjectionNames[i])
              : std::string(key("bottleneck.rank", "model.rank")),
          kProjectionNames[i], r, limit, d_in(p), d_out(p));
    }
  }
  check_sizes(source, hf);
}

// Every product of sizes the model computes (tensor sizes, the parameter count and its bytes)
// must fit 64 bits: a huge width is refused here, naming the keys, before any shape or
// allocation sees a wrapped-around number.
void ModelConfig::check_sizes(const std::string& source, bool hf) const {
  auto key = [hf](const char* hf_name, const char* toml_name) {
    return std::string(hf ? hf_name : toml_name);
  };
  const std::string V = key("vocab_size", "model.vocab_size"),
                    d = key("hidden_size", "model.hidden_size"),
                    ff = key("intermediate_size", "model.intermediate_size"),
                    L = key("num_hidden_layers", "model.num_layers"),
                    T = key("max_position_embeddings", "model.max_seq_len");
  auto too_large = [&](const std::string& what, int64_t a, int64_t b) {
    fail("{}: the model is too large: {} = {} x {} does not fit a 64-bit integer", source, what, a,
         b);
  };
  auto mul = [&](int64_t a, int64_t b, const std::string& what) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) too_large(what, a, b);
    return r;
  };
  auto add = [&](int64_t a, int64_t b, const std::string& what) {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r))
      fail("{}: the model is too large: {} = {} + {} does not fit a 64-bit integer", source, what,
           a, b);
    return r;
  };
  const int64_t embedding = mul(vocab_size, hidden_size, V + " x " + d);
  mul(hidden_size, intermediate_size, d + " x " + ff);
  mul(max_seq_len, head_dim(), T + " x head width");
  int64_t per_block = mul(2, hidden_size, "2 x " + d);
  for (int i = 0; i < kNumProjections; ++i) {
    const auto p = ProjectionId(i);
    const std::string what = fmt::format("{} projection size", kProjectionNames[i]);
    const int64_t size =
        bottleneck == BottleneckKind::none
            ? mul(d_in(p), d_out(p), what + " (" + d + " x outputs)")
            : mul(rank_of(p), add(d_in(p), d_out(p), what), what + " (rank x (inputs + outputs))");
    per_block = add(per_block, size, "the parameters per block");
  }
  int64_t total = mul(num_layers, per_block, L + " x parameters per block");
  total = add(total, embedding, "the parameter count");
  if (!tie_embeddings) total = add(total, embedding, "the parameter count");
  if (bottleneck == BottleneckKind::lax)
    for (int i = 0; i < kNumProjections; ++i) {
      const int64_t r = rank_of(ProjectionId(i));
      const int64_t mix = add(mul(r, r, "rank x rank"), mul(2, r, "2 x rank"), "rank x (rank + 2)");
      total = add(total, mul(num_layers - 1, mix, L + " x lax mixing size"), "the parameter count");
    }
  // Weights, gradients and two AdamW moments in f32.
  mul(total, 16, "the parameter count x 16 bytes");
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

bool given(const nlohmann::json& j, const char* name) {
  return j.contains(name) && !j.at(name).is_null();
}

// Sizes are JSON integers: 64.5 or 2e19 (a float, which a cast would wrap) is refused as such.
int64_t get_int(const nlohmann::json& j, const char* name, const std::string& path) {
  BOTTLE_CHECK(j.contains(name), "{}: missing key '{}'", path, name);
  const nlohmann::json& v = j.at(name);
  BOTTLE_CHECK(
      v.is_number_integer() && !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX)),
      "{}: key '{}' must be an integer in [1, {}], got {}", path, name, INT64_MAX, v.dump());
  return v.get<int64_t>();
}

int64_t get_int_or(const nlohmann::json& j, const char* name, int64_t fallback,
                   const std::string& path) {
  return given(j, name) ? get_int(j, name, path) : fallback;
}

float get_float_or(const nlohmann::json& j, const char* name, float fallback,
                   const std::string& path) {
  if (!given(j, name)) return fallback;
  const nlohmann::json& v = j.at(name);
  BOTTLE_CHECK(v.is_number(), "{}: key '{}' must be a number, got {}", path, name, v.dump());
  const float f = float(v.get<double>());
  BOTTLE_CHECK(std::isfinite(f), "{}: key '{}' must be a finite 32-bit float, got {}", path, name,
               v.dump());
  return f;
}

// HF LlamaConfig keys that change what the model computes: bottle computes only their
// defaults, so any other value is refused rather than silently ignored.
void check_llama_only(const nlohmann::json& j, const ModelConfig& c, const std::string& path) {
  auto refuse = [&](const char* name, const std::string& allowed) {
    fail("{}: key '{}' is {}; bottle computes only {}", path, name, j.at(name).dump(), allowed);
  };
  // A low-rank model is "bottle" / BottleForCausalLM for transformers (its modeling file);
  // earlier bottle checkpoints called it "llama", which still reads.
  const bool low_rank = c.bottleneck != BottleneckKind::none;
  const std::string model_types = low_rank ? "\"llama\" or \"bottle\" models" : "\"llama\" models";
  const std::string classes =
      low_rank ? "[\"LlamaForCausalLM\"] or [\"BottleForCausalLM\"]" : "[\"LlamaForCausalLM\"]";
  if (given(j, "model_type") && j["model_type"] != "llama" &&
      !(low_rank && j["model_type"] == kBottleModelType))
    refuse("model_type", model_types);
  if (given(j, "architectures")) {
    const auto& a = j["architectures"];
    bool ok = a.is_array() && a.size() == 1;
    if (ok) ok = a[0] == "LlamaForCausalLM" || (low_rank && a[0] == kBottleArchitecture);
    if (!ok) refuse("architectures", classes);
  }
  if (given(j, "hidden_act") && j["hidden_act"] != "silu") refuse("hidden_act", "\"silu\"");
  if (given(j, "rope_scaling")) refuse("rope_scaling", "plain RoPE (rope_scaling null)");
  if (given(j, "head_dim") && j["head_dim"] != c.hidden_size / c.num_heads)
    refuse("head_dim",
           fmt::format("hidden_size / num_attention_heads = {}", c.hidden_size / c.num_heads));
  for (const char* bias : {"attention_bias", "mlp_bias"})
    if (given(j, bias) && j[bias] != false) refuse(bias, "layers without bias (false)");
  if (given(j, "pretraining_tp") && j["pretraining_tp"] != 1)
    refuse("pretraining_tp", "unsplit projections (1)");
  if (given(j, "attention_dropout") && j["attention_dropout"] != 0)
    refuse("attention_dropout", "attention without dropout (0)");
}

}  // namespace

ModelConfig read_hf_config(const std::string& path) {
  return parse_hf_config(read_bounded_file(path, "config.json", kMaxJsonBytes), path);
}

ModelConfig parse_hf_config(std::string_view text, const std::string& path) {
  const nlohmann::json j = parse_json_text(text, path);
  BOTTLE_CHECK(j.is_object(), "{}: expected a JSON object", path);
  ModelConfig c;
  c.vocab_size = get_int(j, "vocab_size", path);
  c.hidden_size = get_int(j, "hidden_size", path);
  c.intermediate_size = get_int(j, "intermediate_size", path);
  c.num_layers = get_int(j, "num_hidden_layers", path);
  c.num_heads = get_int(j, "num_attention_heads", path);
  c.num_kv_heads = get_int_or(j, "num_key_value_heads", c.num_heads, path);
  c.max_seq_len = get_int_or(j, "max_position_embeddings", 2048, path);
  c.rms_norm_eps = get_float_or(j, "rms_norm_eps", 1e-6f, path);
  c.rope_theta = get_float_or(j, "rope_theta", 10000.0f, path);
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
    c.rank = get_int_or(b, "rank", 0, where);
    BOTTLE_CHECK(!b.contains("rank") || c.rank > 0, "{}: bottleneck.rank must be positive, got {}",
                 path, c.rank);
    if (b.contains("ranks")) {
      BOTTLE_CHECK(b["ranks"].is_object(), "{}: key 'bottleneck.ranks' must be an object", path);
      for (auto& [name, value] : b["ranks"].items()) {
        int idx = -1;
        for (int i = 0; i < kNumProjections; ++i)
          if (name == kProjectionNames[i]) idx = i;
        BOTTLE_CHECK(idx >= 0, "{}: unknown projection '{}' in bottleneck.ranks", path, name);
        BOTTLE_CHECK(
            value.is_number_integer() &&
                !(value.is_number_unsigned() && value.get<uint64_t>() > uint64_t(INT64_MAX)),
            "{}: bottleneck.ranks.{} must be an integer, got {}", path, name, value.dump());
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
  check_llama_only(j, c, path);
  return c;
}

void write_hf_config(const ModelConfig& c, const std::string& path, DType stored,
                     const SpecialTokenIds& ids) {
  nlohmann::ordered_json j;
  const bool low_rank = c.bottleneck != BottleneckKind::none;
  j["architectures"] = {low_rank ? kBottleArchitecture : "LlamaForCausalLM"};
  j["model_type"] = low_rank ? kBottleModelType : "llama";
  if (low_rank)
    j["auto_map"] = {{"AutoConfig", kBottleAutoConfig}, {"AutoModelForCausalLM", kBottleAutoModel}};
  j["hidden_size"] = c.hidden_size;
  j["intermediate_size"] = c.intermediate_size;
  j["num_hidden_layers"] = c.num_layers;
  j["num_attention_heads"] = c.num_heads;
  j["num_key_value_heads"] = c.num_kv_heads;
  j["vocab_size"] = c.vocab_size;
  j["max_position_embeddings"] = c.max_seq_len;
  // The float's shortest decimal (1e-05, not 9.999999747378752e-06): the same value to float.
  j["rms_norm_eps"] = std::stod(fmt::format("{}", c.rms_norm_eps));
  j["rope_theta"] = std::stod(fmt::format("{}", c.rope_theta));
  j["tie_word_embeddings"] = c.tie_embeddings;
  j["hidden_act"] = "silu";
  j["bos_token_id"] = ids.bos ? nlohmann::ordered_json(*ids.bos) : nlohmann::ordered_json();
  j["eos_token_id"] = ids.eos ? nlohmann::ordered_json(*ids.eos) : nlohmann::ordered_json();
  // generate() pads finished sequences of a batch with EOS, as the tokenizer files do.
  j["pad_token_id"] = ids.eos ? nlohmann::ordered_json(*ids.eos) : nlohmann::ordered_json();
  j["torch_dtype"] = stored == DType::bf16 ? "bfloat16" : "float32";
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
