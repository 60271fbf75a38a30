#include "io/safetensors.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/bf16.h"
#include "io/file_read.h"
#include "io/json_io.h"

namespace bottle {
namespace {

static_assert(std::endian::native == std::endian::little, "safetensors I/O assumes little endian");

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

float half_to_float(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f, mant = h & 0x3ff, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      exp = 127 - 15 + 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((mant & 0x3ff) << 13);
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000 | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

}  // namespace

int64_t SafeTensorEntry::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

SafeTensorsHeader read_safetensors_header(std::istream& in, uint64_t file_size,
                                          const std::string& path) {
  uint64_t header_len = 0;
  BOTTLE_CHECK(file_size >= 8 && in.read(reinterpret_cast<char*>(&header_len), 8),
               "{}: not a safetensors file (shorter than its 8-byte header length)", path);
  BOTTLE_CHECK(header_len >= 2 && header_len <= file_size - 8,
               "{}: not a safetensors file (header length {} does not fit a file of {} bytes)",
               path, header_len, file_size);
  BOTTLE_CHECK(header_len <= kMaxJsonBytes,
               "{}: safetensors header of {} bytes exceeds the limit of {} bytes", path, header_len,
               kMaxJsonBytes);
  std::string text(header_len, '\0');
  BOTTLE_CHECK(in.read(text.data(), std::streamsize(header_len)), "{}: truncated header", path);
  check_json_bounds(text, path + ": safetensors header");
  nlohmann::json j;
  std::string duplicate;
  try {
    j = parse_json_noting_duplicates(text, duplicate);
  } catch (const std::exception& e) {
    fail("{}: not a safetensors file (header is not JSON: {})", path, e.what());
  }
  BOTTLE_CHECK(j.is_object(), "{}: not a safetensors file (header is not a JSON object)", path);
  // A reader that keeps the first and one that keeps the last would see different weights.
  BOTTLE_CHECK(duplicate.empty(), "{}: the header names '{}' more than once", path, duplicate);
  SafeTensorsHeader h;
  h.data_start = 8 + header_len;
  const uint64_t data_size = file_size - h.data_start;
  for (auto& [name, value] : j.items()) {
    if (name == "__metadata__") {
      BOTTLE_CHECK(value.is_object(), "{}: __metadata__ is not an object", path);
      for (auto& [k, v] : value.items())
        h.metadata[k] = v.is_string() ? v.get<std::string>() : v.dump();
      continue;
    }
    try {
      SafeTensorEntry e;
      e.dtype = value.at("dtype").get<std::string>();
      e.shape = value.at("shape").get<std::vector<int64_t>>();
      const auto offsets = value.at("data_offsets").get<std::vector<uint64_t>>();
      BOTTLE_CHECK(offsets.size() == 2, "data_offsets must have two entries");
      e.begin = offsets[0];
      e.end = offsets[1];
      const size_t width = dtype_bytes(e.dtype);
      BOTTLE_CHECK(width != 0, "unknown dtype '{}'", e.dtype);
      // The byte count must fit, or numel() overflows on a hostile shape.
      uint64_t bytes = width;
      for (int64_t d : e.shape) {
        BOTTLE_CHECK(d >= 0, "negative dimension {}", d);
        BOTTLE_CHECK(
            !__builtin_mul_overflow(bytes, uint64_t(d), &bytes) && bytes <= uint64_t(INT64_MAX),
            "shape {} holds more than 2^63 bytes", fmt::join(e.shape, " x "));
      }
      BOTTLE_CHECK(e.begin <= e.end && e.end - e.begin == bytes,
                   "data_offsets [{}, {}) do not hold {} elements of {}", e.begin, e.end, e.numel(),
                   e.dtype);
      BOTTLE_CHECK(
          e.end <= data_size,
          "data ends at byte {} but the file holds only {} bytes of data (truncated file?)", e.end,
          data_size);
      h.entries.emplace(name, std::move(e));
    } catch (const Error& e) {
      fail("{}: tensor '{}': {}", path, name, e.what());
    } catch (const std::exception& e) {
      fail("{}: tensor '{}': malformed header entry ({})", path, name, e.what());
    }
  }
  // The format's data section is the tensors' buffers back to back: an overlap would let two
  // tensors share bytes, a gap or a tail would hide bytes no tensor owns.
  std::vector<std::pair<const std::string*, const SafeTensorEntry*>> by_offset;
  for (const auto& [name, e] : h.entries) by_offset.push_back({&name, &e});
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return std::pair{a.second->begin, a.second->end} < std::pair{b.second->begin, b.second->end};
  });
  uint64_t covered = 0;
  std::pair<const std::string*, const SafeTensorEntry*> previous{nullptr, nullptr};
  for (const auto& [name, e] : by_offset) {
    BOTTLE_CHECK(e->begin >= covered,
                 "{}: tensors '{}' and '{}' overlap (data_offsets [{}, {}) and [{}, {}))", path,
                 *previous.first, *name, previous.second->begin, previous.second->end, e->begin,
                 e->end);
    BOTTLE_CHECK(e->begin == covered,
                 "{}: bytes [{}, {}) of the data belong to no tensor (before '{}'); safetensors "
                 "buffers are contiguous",
                 path, covered, e->begin, *name);
    if (e->end > e->begin) previous = {name, e};
    covered = e->end;
  }
  BOTTLE_CHECK(covered == data_size,
               "{}: bytes [{}, {}) at the end of the data belong to no tensor; safetensors "
               "buffers are contiguous",
               path, covered, data_size);
  return h;
}

SafeTensorsReader::SafeTensorsReader(std::string path) : path_(std::move(path)) {
  // Before the open: a FIFO would block it, a device's size says nothing.
  check_readable_file(path_, "the safetensors file", UINT64_MAX);
  std::ifstream in(path_, std::ios::binary);
  BOTTLE_CHECK(in, "{}: cannot open", path_);
  in.seekg(0, std::ios::end);
  const uint64_t file_size = uint64_t(in.tellg());
  in.seekg(0);
  header_ = read_safetensors_header(in, file_size, path_);
}

const SafeTensorEntry& SafeTensorsReader::entry(const std::string& name) const {
  auto it = header_.entries.find(name);
  BOTTLE_CHECK(it != header_.entries.end(), "{}: missing tensor '{}'", path_, name);
  return it->second;
}

void SafeTensorsReader::read_f32(const std::string& name, std::span<float> out) const {
  const SafeTensorEntry& e = entry(name);
  BOTTLE_CHECK(uint64_t(e.numel()) == out.size(), "{}: tensor '{}' has {} elements, expected {}",
               path_, name, e.numel(), out.size());
  std::ifstream in(path_, std::ios::binary);
  BOTTLE_CHECK(in, "{}: cannot open", path_);
  in.seekg(std::streamoff(header_.data_start + e.begin));
  if (e.dtype == "F32") {
    BOTTLE_CHECK(in.read(reinterpret_cast<char*>(out.data()), std::streamsize(e.end - e.begin)),
                 "{}: tensor '{}': read failed", path_, name);
    check_finite(name, out);
    return;
  }
  std::vector<uint16_t> raw(out.size());
  BOTTLE_CHECK(e.dtype == "BF16" || e.dtype == "F16",
               "{}: tensor '{}' has dtype {}; bottle reads F32, BF16 and F16", path_, name,
               e.dtype);
  BOTTLE_CHECK(in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(e.end - e.begin)),
               "{}: tensor '{}': read failed", path_, name);
  for (size_t i = 0; i < raw.size(); ++i)
    out[i] =
        e.dtype == "BF16" ? std::bit_cast<float>(uint32_t(raw[i]) << 16) : half_to_float(raw[i]);
  check_finite(name, out);
}

void SafeTensorsReader::check_finite(const std::string& name, std::span<const float> values) const {
  // A NaN or inf weight only ever turns into a NaN loss or garbage text later.
  const auto bad =
      std::find_if(values.begin(), values.end(), [](float x) { return !std::isfinite(x); });
  BOTTLE_CHECK(bad == values.end(),
               "{}: tensor '{}' holds a non-finite value ({}) at element {}; the weights are "
               "damaged (a diverged run?)",
               path_, name, *bad, bad - values.begin());
}

SafeTensorsWriter::SafeTensorsWriter(std::string path, const std::vector<Spec>& tensors,
                                     const std::map<std::string, std::string>& metadata,
                                     DType stored)
    : path_(std::move(path)), stored_(stored) {
  BOTTLE_CHECK(stored == DType::f32 || stored == DType::bf16,
               "{}: tensors are written as f32 or bf16, not {}", path_, dtype_name(stored));
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Spec& t : tensors) {
    int64_t numel = 1;
    for (const int64_t d : t.shape) numel *= d;
    const uint64_t bytes = uint64_t(numel) * dtype_size(stored);
    header[t.name] = {{"dtype", stored == DType::bf16 ? "BF16" : "F32"},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
    left_ += uint64_t(numel);
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  BOTTLE_CHECK(fd_ >= 0, "{}: cannot open for writing: {}", path_, std::strerror(errno));
  const uint64_t len = text.size();
  write_bytes(&len, 8);
  write_bytes(text.data(), text.size());
}

SafeTensorsWriter::SafeTensorsWriter(SafeTensorsWriter&& other) noexcept
    : path_(std::move(other.path_)),
      stored_(other.stored_),
      left_(other.left_),
      fd_(std::exchange(other.fd_, -1)),
      narrowed_(std::move(other.narrowed_)) {}

SafeTensorsWriter::~SafeTensorsWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void SafeTensorsWriter::write_bytes(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    // ENOSPC, or EFBIG under a file-size limit: the system's reason, read at once.
    BOTTLE_CHECK(n > 0, "{}: write failed ({})", path_,
                 n < 0 ? std::strerror(errno) : "no progress: disk full?");
    p += n;
    bytes -= size_t(n);
  }
}

void SafeTensorsWriter::write(std::span<const float> values) {
  BOTTLE_ASSERT(values.size() <= left_, "{}: {} values past the tensors' end", path_,
                values.size() - left_);
  left_ -= values.size();
  if (stored_ == DType::f32) {
    write_bytes(values.data(), values.size_bytes());
    return;
  }
  narrowed_.resize(values.size());
  for (size_t i = 0; i < values.size(); ++i) narrowed_[i] = bf16_from_float(values[i]);
  write_bytes(narrowed_.data(), narrowed_.size() * sizeof(uint16_t));
}

void SafeTensorsWriter::close() {
  BOTTLE_ASSERT(left_ == 0, "{}: closed with {} values of its tensors unwritten", path_, left_);
  const int rc = ::close(std::exchange(fd_, -1));
  BOTTLE_CHECK(rc == 0, "{}: write failed ({})", path_, std::strerror(errno));
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata, DType stored) {
  std::vector<SafeTensorsWriter::Spec> specs;
  for (const auto& [name, t] : tensors) {
    BOTTLE_CHECK(t.dtype == DType::f32, "{}: tensor '{}' must be f32 to be written", path, name);
    specs.push_back(
        {name, std::vector<int64_t>(t.shape.dims.begin(), t.shape.dims.begin() + t.shape.rank)});
  }
  SafeTensorsWriter out(path, specs, metadata, stored);
  for (const auto& nt : tensors) out.write(std::span(nt.tensor.f32(), size_t(nt.tensor.numel())));
  out.close();
}

}  // namespace bottle
