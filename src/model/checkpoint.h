#pragma once
// The HF-compatible model directory (docs/design.md §12): config.json + model.safetensors,
// names and [out, in] layout as HF LLaMA. Those two files alone are a complete model.
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "io/safetensors.h"
#include "model/llama.h"
#include "model/sharded_checkpoint.h"

namespace bottle {

inline constexpr const char* kConfigFile = "config.json";
inline constexpr const char* kWeightsFile = "model.safetensors";

// Throws unless `dir` is missing or an empty directory: a model is never written over
// another (an export into a training checkpoint would leave its optimizer state behind).
void check_new_model_directory(const std::string& dir);
// config.json in `dir` and, for a low-rank model, the transformers modeling files its
// auto_map names (hf_modeling_files.h). Returns the paths written.
std::vector<std::filesystem::path> write_model_description(const ModelConfig& config,
                                                           const std::filesystem::path& dir,
                                                           DType stored = DType::f32,
                                                           const SpecialTokenIds& ids = {});
// Writes both files into `dir` (created if missing, else empty; see above). Under tensor
// parallelism every rank of the group calls it; the slices are gathered and the TP group's rank 0
// writes the single model, the same files a one-rank run writes. `stored`: the weights'
// dtype in the file (bf16: rounded to nearest even, for inference; torch_dtype says so).
// `ids`: the tokenizer's special tokens, for config.json.
void save_model(const LlamaModel& model, const std::string& dir, DType stored = DType::f32,
                const SpecialTokenIds& ids = {});
// Reads config.json of `dir`; errors name the file and key.
ModelConfig read_model_config(const std::string& dir);
// Loads every parameter of `model` from dir/model.safetensors, each rank its own slice.
// Errors name the tensor and the file: a missing tensor, a wrong shape, an unexpected
// tensor, an unreadable dtype.
void load_model_weights(LlamaModel& model, const std::string& dir);
// The same from a sharded checkpoint (model/sharded_checkpoint.h): each rank reads its own slice
// of every parameter from whichever pieces hold it, whatever layout wrote them.
void load_model_weights(LlamaModel& model, const ShardedCheckpoint& checkpoint);
// A checkpoint's model directory written into `out` (config.json, the modeling files,
// model.safetensors): from a sharded checkpoint tensor by tensor, one whole tensor in memory at a
// time; from any other checkpoint loaded whole and saved. Errors name the checkpoint's files.
void export_model(const std::string& dir, const std::string& out, DType stored,
                  const SpecialTokenIds& ids);
// Both of the above.
std::unique_ptr<LlamaModel> load_model(const std::string& dir);

// Writes this rank's parameter-shaped tensors, whole: for each (prefix, flat buffer laid
// out like params.values()), one tensor `prefix + name` per parameter, gathered over the
// TP group. Every rank of the TP group calls it; its rank 0 writes `path`.
void write_gathered(const std::string& path, const ParameterStore& params, Communicator* tp,
                    const std::vector<std::pair<std::string, Tensor>>& sources,
                    const std::map<std::string, std::string>& metadata, DType stored = DType::f32);
// The tensors of a checkpoint directory stored as STEM.safetensors or as shards with an
// index: finds the file holding each tensor.
class ShardedReader {
 public:
  ShardedReader(const std::string& dir, const std::string& stem);
  const SafeTensorsReader& reader_for(const std::string& tensor) const;
  // Every tensor name (to reject unexpected ones).
  std::vector<std::string> names() const;

 private:
  std::string dir_, stem_;
  std::map<std::string, std::string> weight_map_;  // empty: one file
  mutable std::map<std::string, std::unique_ptr<SafeTensorsReader>> readers_;
};

// The whole of a parameter-shaped tensor whose slice this rank holds (host copies; every
// rank of the TP group calls it and gets the whole).
std::vector<float> gather_parameter(const ParamSpec& spec, std::vector<float> local,
                                    Communicator* tp);
// This rank's slice (on the host) of the whole tensor `name` of `reader`, shaped like
// `spec`'s whole; the caller stages it into its tensor with Backend::from_host.
std::vector<float> read_parameter_slice(const SafeTensorsReader& reader, const std::string& name,
                                        const ParamSpec& spec);

}  // namespace bottle
