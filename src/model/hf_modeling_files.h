#pragma once
// The Python files that let transformers build a low-rank (SVD / CoLA / LaX) bottle model:
// `AutoModelForCausalLM.from_pretrained(dir, trust_remote_code=True)` follows config.json's
// auto_map to them. Kept in hf/ and compiled in, so a checkpoint is complete on its own.
#include <string_view>
#include <vector>

namespace bottle {

struct HfModelingFile {
  std::string_view name;  // e.g. "modeling_bottle.py"
  std::string_view text;
};

const std::vector<HfModelingFile>& hf_modeling_files();

// config.json's names for a low-rank model: its model_type and class, and the auto_map entries.
inline constexpr const char* kBottleModelType = "bottle";
inline constexpr const char* kBottleArchitecture = "BottleForCausalLM";
inline constexpr const char* kBottleAutoConfig = "configuration_bottle.BottleConfig";
inline constexpr const char* kBottleAutoModel = "modeling_bottle.BottleForCausalLM";

}  // namespace bottle
