#pragma once
// The HF-compatible model directory (DESIGN §7): config.json + model.safetensors, names and
// [out, in] layout as HF LLaMA. Those two files alone are a complete model.
#include <memory>
#include <string>

#include "model/llama.h"

namespace bottle {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kWeightsFile = "model.safetensors";

// Writes both files into `dir` (created if missing).
void save_model(const LlamaModel& model, const std::string& dir);
// Reads config.json of `dir`; errors name the file and key.
ModelConfig read_model_config(const std::string& dir);
// Loads every parameter of `model` from dir/model.safetensors. Errors name the tensor and
// the file: a missing tensor, a wrong shape, an unexpected tensor, an unreadable dtype.
void load_model_weights(LlamaModel& model, const std::string& dir);
// Both of the above.
std::unique_ptr<LlamaModel> load_model(const std::string& dir);

}  // namespace bottle
