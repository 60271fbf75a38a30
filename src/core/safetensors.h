#pragma once
// The safetensors format: u64 little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw data.
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace bottle {

struct SafeTensorEntry {
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // offsets into the data section
  int64_t numel() const;
};

class SafeTensorsReader {
 public:
  // Reads and validates the header; every error names `path`.
  explicit SafeTensorsReader(std::string path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafeTensorEntry>& entries() const { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const { return entries_.count(name) != 0; }
  // Throws naming the tensor and the file when it is missing.
  const SafeTensorEntry& entry(const std::string& name) const;
  // Converts F32 / BF16 / F16 to f32 into `out`, whose size must match. A NaN or inf value
  // is an error naming the tensor and the file.
  void read_f32(const std::string& name, std::span<float> out) const;

 private:
  void check_finite(const std::string& name, std::span<const float> values) const;

  std::string path_;
  uint64_t data_start_ = 0;
  std::map<std::string, SafeTensorEntry> entries_;
  std::map<std::string, std::string> metadata_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // f32 host memory
};

// Writes f32 tensors. Written to `path` directly: callers that need atomicity write into a
// temporary directory and rename it.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace bottle
