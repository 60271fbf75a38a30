#pragma once
// The HF-compatible model directory (DESIGN §7): config.json + model.safetensors, names and
// [out, in] layout as HF LLaMA. Those two files alone are a complete model.
#include <memory>
#include <string>

#include "core/safetensors.h"
#include "model/llama.h"

namespace bottle {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kWeightsFile = "model.safetensors";

// Writes both files into `dir` (created if missing). Under tensor parallelism every rank of
// the group calls it; the slices are gathered and the TP group's rank 0 writes the single
// model, the same files a one-rank run writes.
void save_model(const LlamaModel& model, const std::string& dir);
// Reads config.json of `dir`; errors name the file and key.
ModelConfig read_model_config(const std::string& dir);
// Loads every parameter of `model` from dir/model.safetensors, each rank its own slice.
// Errors name the tensor and the file: a missing tensor, a wrong shape, an unexpected
// tensor, an unreadable dtype.
void load_model_weights(LlamaModel& model, const std::string& dir);
// Both of the above.
std::unique_ptr<LlamaModel> load_model(const std::string& dir);

// The whole of a parameter-shaped tensor whose slice this rank holds at `local` (every rank
// of the TP group calls it and gets the whole).
std::vector<float> gather_parameter(const ParamSpec& spec, const float* local, Communicator* tp);
// This rank's slice of the whole tensor `name` of `reader`, shaped like `spec`'s whole.
void read_parameter_slice(const SafeTensorsReader& reader, const std::string& name,
                          const ParamSpec& spec, float* local);

}  // namespace bottle
