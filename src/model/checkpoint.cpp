#include "model/checkpoint.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <span>

namespace bottle {

namespace fs = std::filesystem;

std::vector<float> gather_parameter(const ParamSpec& spec, const float* local, Communicator* tp) {
  const int64_t n = spec.shape.numel();
  if (!spec.sharded() || !tp || tp->size() == 1) return std::vector<float>(local, local + n);
  std::vector<float> blocks(size_t(n) * size_t(tp->size()));
  tp->all_gather(Tensor{blocks.data(), {int64_t(blocks.size())}},
                 Tensor{const_cast<float*>(local), {n}}, "checkpoint.gather");
  std::vector<float> whole(size_t(spec.full_shape.numel()));
  for (int r = 0; r < tp->size(); ++r) {
    const int64_t offset = spec.shape[spec.shard_dim] * r;
    for (int64_t j = 0; j < n; ++j) whole[spec.global_index(j, offset)] = blocks[r * n + j];
  }
  return whole;
}

void read_parameter_slice(const SafeTensorsReader& reader, const std::string& name,
                          const ParamSpec& spec, float* local) {
  const SafeTensorEntry& entry = reader.entry(name);
  const Shape& whole_shape = spec.full_shape;
  const std::vector<int64_t> expected(whole_shape.dims.begin(),
                                      whole_shape.dims.begin() + whole_shape.rank);
  BOTTLE_CHECK(entry.shape == expected, "{}: tensor '{}' has shape [{}], expected {}",
               reader.path(), name, fmt::join(entry.shape, ", "), whole_shape.str());
  const int64_t n = spec.shape.numel();
  if (!spec.sharded()) {
    reader.read_f32(name, std::span<float>(local, size_t(n)));
    return;
  }
  std::vector<float> whole(size_t(whole_shape.numel()));
  reader.read_f32(name, std::span<float>(whole));
  for (int64_t j = 0; j < n; ++j) local[j] = whole[spec.global_index(j)];
}

void save_model(const LlamaModel& model, const std::string& dir) {
  Communicator* tp = model.tensor_parallel().comm;
  const bool writer = !tp || tp->rank() == 0;
  const ParameterStore& params = model.parameters();
  std::vector<std::vector<float>> whole;
  for (size_t i = 0; i < params.specs().size(); ++i)
    whole.push_back(gather_parameter(params.specs()[i], params.at(i).value.f32(), tp));
  if (!writer || dir.empty()) return;
  fs::create_directories(dir);
  write_hf_config(model.config(), (fs::path(dir) / kConfigFile).string());
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < params.specs().size(); ++i)
    tensors.push_back(
        {params.specs()[i].name, Tensor{whole[i].data(), params.specs()[i].full_shape}});
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
  for (size_t i = 0; i < params.specs().size(); ++i)
    read_parameter_slice(reader, params.specs()[i].name, params.specs()[i],
                         params.at(i).value.f32());
}

std::unique_ptr<LlamaModel> load_model(const std::string& dir) {
  auto model = std::make_unique<LlamaModel>(read_model_config(dir));
  load_model_weights(*model, dir);
  return model;
}

}  // namespace bottle
