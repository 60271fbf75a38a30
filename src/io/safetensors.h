#pragma once
// The safetensors format: u64 little-endian header length, a JSON header
// {name: {dtype, shape, data_offsets}, "__metadata__": {...}}, then the raw data.
#include <cstdint>
#include <istream>
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

struct SafeTensorsHeader {
  uint64_t data_start = 0;  // the data section's offset in the file
  std::map<std::string, SafeTensorEntry> entries;
  std::map<std::string, std::string> metadata;
};

// Reads and validates the header at the start of `in`, a file of `file_size` bytes; every
// error names `path`. In memory, so that a fuzzer drives the same code as the reader.
SafeTensorsHeader read_safetensors_header(std::istream& in, uint64_t file_size,
                                          const std::string& path);

class SafeTensorsReader {
 public:
  // Reads and validates the header; every error names `path`.
  explicit SafeTensorsReader(std::string path);

  const std::string& path() const { return path_; }
  const std::map<std::string, SafeTensorEntry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  bool contains(const std::string& name) const { return header_.entries.count(name) != 0; }
  // Throws naming the tensor and the file when it is missing.
  const SafeTensorEntry& entry(const std::string& name) const;
  // Converts F32 / BF16 / F16 to f32 into `out`, whose size must match. A NaN or inf value
  // is an error naming the tensor and the file.
  void read_f32(const std::string& name, std::span<float> out) const;

 private:
  void check_finite(const std::string& name, std::span<const float> values) const;

  std::string path_;
  SafeTensorsHeader header_;
};

struct NamedTensor {
  std::string name;
  Tensor tensor;  // f32 host memory
};

// A safetensors file written tensor by tensor: the header is made from the names and shapes
// first, then each tensor's f32 values arrive in order, in as many parts as the caller likes,
// so that a writer never holds more than the part it stages (a checkpoint's rank streams its
// slices from the device through a bounded buffer). Stored as F32, or as BF16 (rounded to
// nearest even). Every error names `path`; close() fails unless every value arrived.
class SafeTensorsWriter {
 public:
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
  };
  SafeTensorsWriter(std::string path, const std::vector<Spec>& tensors,
                    const std::map<std::string, std::string>& metadata = {},
                    DType stored = DType::f32);
  ~SafeTensorsWriter();
  SafeTensorsWriter(SafeTensorsWriter&& other) noexcept;
  SafeTensorsWriter(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter& operator=(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter& operator=(SafeTensorsWriter&&) = delete;
  // The next values of the tensors, in order.
  void write(std::span<const float> values);
  // Closes the file; fails unless every value arrived. (Writes go straight to the file, so a
  // full disk fails the write that meets it, with the system's reason.)
  void close();

 private:
  void write_bytes(const void* data, size_t bytes);

  std::string path_;
  DType stored_;
  uint64_t left_ = 0;  // values still to come
  int fd_ = -1;
  std::vector<uint16_t> narrowed_;
};

// Writes f32 tensors, stored as F32, or as BF16 (rounded to nearest even) when `stored` is
// bf16. Written to `path` directly: callers that need atomicity write into a temporary
// directory and rename it.
void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       DType stored = DType::f32);

}  // namespace bottle
