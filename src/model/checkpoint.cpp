#include "model/checkpoint.h"

#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>

#include "io/json_io.h"
#include "model/hf_modeling_files.h"
#include "parallel/tp_layouts.h"

namespace bottle {

namespace fs = std::filesystem;

std::vector<float> gather_parameter(const ParamSpec& spec, std::vector<float> local,
                                    Communicator* tp) {
  const int64_t n = spec.shape.numel();
  if (!spec.sharded() || !tp || tp->size() == 1) return local;
  std::vector<float> blocks(size_t(n) * size_t(tp->size()));
  tp->all_gather(host_tensor(std::span(blocks)), host_tensor(std::span(local)),
                 "checkpoint.gather");
  std::vector<float> whole(size_t(spec.full_shape.numel()));
  for (int r = 0; r < tp->size(); ++r) {
    const int64_t offset = spec.shape[spec.shard_dim] * r;
    for (int64_t j = 0; j < n; ++j) whole[spec.global_index(j, offset)] = blocks[r * n + j];
  }
  return whole;
}

std::vector<float> read_parameter_slice(const SafeTensorsReader& reader, const std::string& name,
                                        const ParamSpec& spec) {
  const SafeTensorEntry& entry = reader.entry(name);
  const Shape& whole_shape = spec.full_shape;
  const std::vector<int64_t> expected(whole_shape.dims.begin(),
                                      whole_shape.dims.begin() + whole_shape.rank);
  BOTTLE_CHECK(entry.shape == expected, "{}: tensor '{}' has shape [{}], expected {}",
               reader.path(), name, fmt::join(entry.shape, ", "), whole_shape.str());
  std::vector<float> whole(size_t(whole_shape.numel()));
  reader.read_f32(name, std::span<float>(whole));
  if (!spec.sharded()) return whole;
  std::vector<float> local(size_t(spec.shape.numel()));
  for (size_t j = 0; j < local.size(); ++j) local[j] = whole[size_t(spec.global_index(int64_t(j)))];
  return local;
}

namespace {

// HF's index of a sharded model: STEM.safetensors.index.json.
std::string index_file_name(const std::string& stem) { return stem + ".safetensors.index.json"; }

// Gathers every tensor over the TP group; tensor j is kept by the rank owner(j), which
// writes what it kept to `path` (a rank that keeps nothing writes nothing).
template <typename Owner>
void write_owned(const std::string& path, const ParameterStore& params, Communicator* tp,
                 const std::vector<std::pair<std::string, Tensor>>& sources,
                 const std::map<std::string, std::string>& metadata, Owner owner,
                 DType stored = DType::f32) {
  const int rank = tp ? tp->rank() : 0;
  std::vector<std::vector<float>> kept;
  std::vector<std::pair<std::string, Shape>> names;
  int j = 0;
  for (const auto& [prefix, flat] : sources)
    for (const ParamSpec& spec : params.specs()) {
      std::vector<float> local(size_t(spec.shape.numel()));
      params.backend().to_host(local.data(), flat.view(spec.offset, spec.shape));
      std::vector<float> whole = gather_parameter(spec, std::move(local), tp);
      if (owner(j++) != rank) continue;
      kept.push_back(std::move(whole));
      names.push_back({prefix + spec.name, spec.full_shape});
    }
  if (kept.empty()) return;
  std::vector<NamedTensor> tensors;
  for (size_t i = 0; i < kept.size(); ++i)
    tensors.push_back({names[i].first, host_tensor(std::span(kept[i])).reshaped(names[i].second)});
  write_safetensors(path, tensors, metadata, stored);
}

}  // namespace

void write_gathered(const std::string& path, const ParameterStore& params, Communicator* tp,
                    const std::vector<std::pair<std::string, Tensor>>& sources,
                    const std::map<std::string, std::string>& metadata, DType stored) {
  write_owned(
      path, params, tp, sources, metadata, [](int) { return 0; }, stored);
}

ShardedReader::ShardedReader(const std::string& dir, const std::string& stem)
    : dir_(dir), stem_(stem) {
  const fs::path single = fs::path(dir) / (stem + ".safetensors");
  const fs::path index = fs::path(dir) / index_file_name(stem);
  std::error_code ec;
  const bool has_single = fs::exists(single, ec), has_index = fs::exists(index, ec);
  // Which of the two a reader picks differs between tools; two models in one place is an error.
  BOTTLE_CHECK(!(has_single && has_index),
               "{}: both {} and {} exist; a checkpoint holds one or the other (remove one)", dir,
               single.filename().string(), index.filename().string());
  if (has_single) return;
  BOTTLE_CHECK(has_index, "{}: neither {} nor {} exists", dir, single.filename().string(),
               index.filename().string());
  const nlohmann::json j = read_json_file(index.string());
  BOTTLE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(),
               "{}: not a safetensors index (no 'weight_map' object)", index.string());
  for (const auto& [name, file] : j["weight_map"].items()) {
    BOTTLE_CHECK(file.is_string(), "{}: weight_map entry '{}' must be a file name, got {}",
                 index.string(), name, file.dump());
    const std::string f = file.get<std::string>();
    // Shards lie beside the index: a path could read any file on the machine.
    BOTTLE_CHECK(!f.empty() && f.find('/') == std::string::npos &&
                     f.find('\\') == std::string::npos && f != "." && f != "..",
                 "{}: weight_map entry '{}' names '{}'; it must be a file name in {} (no "
                 "directories, no '..')",
                 index.string(), name, f, dir);
    weight_map_[name] = f;
  }
  BOTTLE_CHECK(!weight_map_.empty(), "{}: weight_map is empty", index.string());
}

const SafeTensorsReader& ShardedReader::reader_for(const std::string& tensor) const {
  std::string file = stem_ + ".safetensors";
  if (!weight_map_.empty()) {
    const auto it = weight_map_.find(tensor);
    BOTTLE_CHECK(it != weight_map_.end(), "{}: tensor '{}' is in no file of {}", dir_, tensor,
                 index_file_name(stem_));
    file = it->second;
  }
  auto& reader = readers_[file];
  if (!reader) reader = std::make_unique<SafeTensorsReader>((fs::path(dir_) / file).string());
  return *reader;
}

std::vector<std::string> ShardedReader::names() const {
  std::vector<std::string> out;
  if (weight_map_.empty()) {
    for (const auto& [name, entry] : reader_for("").entries()) out.push_back(name);
  } else {
    for (const auto& [name, file] : weight_map_) out.push_back(name);
  }
  return out;
}

void check_new_model_directory(const std::string& dir) {
  std::error_code ec;
  const fs::file_status st = fs::symlink_status(dir, ec);
  if (ec || !fs::exists(st)) return;  // not there yet: create_directories reports what fails
  BOTTLE_CHECK(fs::is_directory(st), "{}: exists and is not a directory; choose a new directory",
               dir);
  const bool empty = fs::is_empty(dir, ec);
  BOTTLE_CHECK(!ec, "{}: cannot read the directory: {}", dir, ec.message());
  // Writing into a checkpoint would mix these weights with its optimizer state and config.
  BOTTLE_CHECK(empty,
               "{}: already exists and is not empty{}; bottle writes a model only into a new or "
               "empty directory",
               dir, fs::exists(fs::path(dir) / kConfigFile, ec) ? " (it holds a model)" : "");
}

std::vector<fs::path> write_model_description(const ModelConfig& config, const fs::path& dir,
                                              DType stored, const SpecialTokenIds& ids) {
  std::vector<fs::path> written{dir / kConfigFile};
  write_hf_config(config, written[0].string(), stored, ids);
  if (config.bottleneck != BottleneckKind::none)
    for (const HfModelingFile& file : hf_modeling_files()) {
      written.push_back(dir / file.name);
      std::ofstream out(written.back(), std::ios::binary | std::ios::trunc);
      out.write(file.text.data(), std::streamsize(file.text.size()));
      out.close();
      BOTTLE_CHECK(out, "{}: write failed", written.back().string());
    }
  return written;
}

void save_model(const LlamaModel& model, const std::string& dir, DType stored,
                const SpecialTokenIds& ids) {
  BOTTLE_CHECK(model.stage().stages == 1,
               "save_model writes a whole model; a pipeline stage writes its shard "
               "(CheckpointStore)");
  Communicator* tp = model.tensor_parallel().comm;
  if (!tp || tp->rank() == 0) {
    check_new_model_directory(dir);
    try {
      fs::create_directories(dir);
    } catch (const fs::filesystem_error& e) {
      fail("{}: cannot create the model directory: {}", dir, e.code().message());
    }
    write_model_description(model.config(), dir, stored, ids);
  }
  BOTTLE_ASSERT(!model.parameters().value_slots(),
                "save_model of a ZeRO-3 model (its checkpoints go through the CheckpointStore)");
  write_gathered((fs::path(dir) / kWeightsFile).string(), model.parameters(), tp,
                 {{"", model.parameters().values()}}, {{"format", "pt"}}, stored);
}

ModelConfig read_model_config(const std::string& dir) {
  std::error_code ec;
  const bool is_dir = fs::is_directory(dir, ec);
  BOTTLE_CHECK(!ec || ec == std::errc::no_such_file_or_directory,
               "{}: cannot read the checkpoint directory: {}", dir, ec.message());
  BOTTLE_CHECK(is_dir, "{}: checkpoint directory does not exist", dir);
  return read_hf_config((fs::path(dir) / kConfigFile).string());
}

void load_model_weights(LlamaModel& model, const ShardedCheckpoint& checkpoint) {
  const ParameterStore& params = model.parameters();
  // A model on one stage holds every parameter: any other weight in the index is foreign.
  if (model.stage().stages == 1)
    for (const std::string& name : checkpoint.names())
      BOTTLE_CHECK(name.find('/') != std::string::npos || params.contains(name),
                   "{}: unexpected tensor '{}' (not a parameter of the model {} describes)",
                   checkpoint.index_path(), name, kConfigFile);
  std::vector<float> slice;  // [one parameter's slice]
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    slice.resize(size_t(spec.shape.numel()));
    checkpoint.read(spec.name, spec, 0, spec.shape.numel(), slice);
    params.set_values(i, slice.data());
  }
  params.refresh_compute(params.backend());
}

void load_model_weights(LlamaModel& model, const std::string& dir) {
  if (is_sharded_checkpoint(dir)) {
    load_model_weights(model, ShardedCheckpoint(dir));
    return;
  }
  const ShardedReader files(dir, "model");
  const ParameterStore& params = model.parameters();
  // A model on one stage holds every parameter: anything else in the files is foreign.
  if (model.stage().stages == 1)
    for (const std::string& name : files.names())
      BOTTLE_CHECK(params.contains(name),
                   "{}: unexpected tensor '{}' (not a parameter of the model {} describes)",
                   files.reader_for(name).path(), name, kConfigFile);
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const std::string& name = params.specs()[i].name;
    const std::vector<float> slice =
        read_parameter_slice(files.reader_for(name), name, params.specs()[i]);
    params.set_values(i, slice.data());
  }
  params.refresh_compute(params.backend());
}

void export_model(const std::string& dir, const std::string& out, DType stored,
                  const SpecialTokenIds& ids) {
  if (!is_sharded_checkpoint(dir)) {
    save_model(*load_model(dir), out, stored, ids);
    return;
  }
  const ModelConfig config = read_model_config(dir);
  // The names, in the order a model saves them, from a model laid out without memory.
  const LlamaModel plan(config, TensorParallel{&default_tp_layout(config.shape())}, 1,
                        PipelineStage{}, /*reserve_only=*/true);
  std::vector<std::string> names;
  for (const ParamSpec& spec : plan.parameters().specs()) names.push_back(spec.name);
  check_new_model_directory(out);
  try {
    fs::create_directories(out);
  } catch (const fs::filesystem_error& e) {
    fail("{}: cannot create the model directory: {}", out, e.code().message());
  }
  write_model_description(config, out, stored, ids);
  consolidate_weights(ShardedCheckpoint(dir), names, (fs::path(out) / kWeightsFile).string(),
                      stored);
}

std::unique_ptr<LlamaModel> load_model(const std::string& dir) {
  auto model = std::make_unique<LlamaModel>(read_model_config(dir));
  load_model_weights(*model, dir);
  return model;
}

}  // namespace bottle
