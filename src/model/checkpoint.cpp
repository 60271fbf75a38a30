#include "model/checkpoint.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <span>

#include "core/safetensors.h"

namespace bottle {

namespace fs = std::filesystem;

void save_model(const LlamaModel& model, const std::string& dir) {
  fs::create_directories(dir);
  write_hf_config(model.config(), (fs::path(dir) / kConfigFile).string());
  std::vector<NamedTensor> tensors;
  const ParameterStore& params = model.parameters();
  for (size_t i = 0; i < params.specs().size(); ++i)
    tensors.push_back({params.specs()[i].name, params.at(i).value});
  write_safetensors((fs::path(dir) / kWeightsFile).string(), tensors, {{"format", "pt"}});
}

ModelConfig read_model_config(const std::string& dir) {
  BOTTLE_CHECK(fs::is_directory(dir), "{}: checkpoint directory does not exist", dir);
  return read_hf_config((fs::path(dir) / kConfigFile).string());
}

void load_model_weights(LlamaModel& model, const std::string& dir) {
  const SafeTensorsReader reader((fs::path(dir) / kWeightsFile).string());
  const ParameterStore& params = model.parameters();
  for (const auto& [name, entry] : reader.entries())
    BOTTLE_CHECK(params.contains(name),
                 "{}: unexpected tensor '{}' (not a parameter of the model {} describes)",
                 reader.path(), name, kConfigFile);
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const SafeTensorEntry& entry = reader.entry(spec.name);
    const std::vector<int64_t> expected(spec.shape.dims.begin(),
                                        spec.shape.dims.begin() + spec.shape.rank);
    BOTTLE_CHECK(entry.shape == expected, "{}: tensor '{}' has shape [{}], expected {}",
                 reader.path(), spec.name, fmt::join(entry.shape, ", "), spec.shape.str());
    const Tensor value = params.at(i).value;
    reader.read_f32(spec.name, std::span<float>(value.f32(), size_t(value.numel())));
  }
}

std::unique_ptr<LlamaModel> load_model(const std::string& dir) {
  auto model = std::make_unique<LlamaModel>(read_model_config(dir));
  load_model_weights(*model, dir);
  return model;
}

}  // namespace bottle
