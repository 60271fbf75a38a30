#pragma once
// The model's shape: everything needed to build it, read from and written to the HF
// config.json of a checkpoint (docs/design.md §12) and from the [model] section of a TOML config.
#include <array>
#include <optional>
#include <string>
#include <string_view>

#include "nn/model_shape.h"
#include "nn/projection.h"

namespace bottle {

struct ModelConfig {
  int64_t vocab_size = 256;
  int64_t hidden_size = 256;
  int64_t intermediate_size = 688;
  int64_t num_layers = 4;
  int64_t num_heads = 8;
  int64_t num_kv_heads = 8;
  int64_t max_seq_len = 1024;
  float rms_norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  bool tie_embeddings = false;
  BottleneckKind bottleneck = BottleneckKind::none;
  int64_t rank = 0;                              // 0: hidden_size / 4
  std::array<int64_t, kNumProjections> ranks{};  // 0: `rank`
  std::optional<bool> mlp_gate_act;              // unset: SiLU for full-rank models only

  int64_t head_dim() const { return hidden_size / num_heads; }
  int64_t rank_of(ProjectionId p) const;
  bool gate_act() const { return mlp_gate_act.value_or(bottleneck == BottleneckKind::none); }
  int64_t d_in(ProjectionId p) const;
  int64_t d_out(ProjectionId p) const;
  int64_t parameter_count() const;
  // The shapes a tensor-parallel layout splits (parallel/tp_layout.h).
  ModelShape shape() const;

  // Throws one error naming `source` and the offending key when the shape is impossible.
  // `hf_keys` picks config.json key names, otherwise the TOML [model] names.
  void validate(const std::string& source, bool hf_keys) const;

 private:
  void check_sizes(const std::string& source, bool hf_keys) const;
};

// "" when a and b describe the same model, else the first difference, e.g.
// "hidden_size: 256 vs 128".
std::string model_config_difference(const ModelConfig& a, const ModelConfig& b);

// The tokenizer's BOS and EOS ids, which config.json records (null when there are none) so that
// transformers' generate() stops where bottle's tokenizer says, never at LlamaConfig's defaults.
struct SpecialTokenIds {
  std::optional<int64_t> bos, eos;
};

ModelConfig read_hf_config(const std::string& path);
// The same from the file's text, named `path` in errors (what a fuzzer drives).
ModelConfig parse_hf_config(std::string_view text, const std::string& path);
// torch_dtype is the dtype the weights file stores: "float32", or "bfloat16" for a bf16 export.
void write_hf_config(const ModelConfig& config, const std::string& path, DType stored = DType::f32,
                     const SpecialTokenIds& ids = {});

}  // namespace bottle
