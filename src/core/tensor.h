#pragma once
// A Tensor is a non-owning view: pointer, dtype, device and a row-major shape. Memory is
// owned by arenas (arena.h), one per purpose, so that every byte is accounted to a tag.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace bottle {

enum class DType : uint8_t { f32, bf16, i32 };
enum class Device : uint8_t { cpu };

inline size_t dtype_size(DType t) { return t == DType::bf16 ? 2 : 4; }
inline const char* dtype_name(DType t) {
  return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : "i32";
}

struct Shape {
  static constexpr int kMaxRank = 4;
  std::array<int64_t, kMaxRank> dims{};
  int rank = 0;

  Shape() = default;
  Shape(std::initializer_list<int64_t> d) {
    BOTTLE_CHECK(d.size() <= kMaxRank, "shape of rank {} exceeds {}", d.size(), kMaxRank);
    for (int64_t v : d) dims[rank++] = v;
  }
  int64_t operator[](int i) const { return dims[i]; }
  int64_t numel() const {
    int64_t n = 1;
    for (int i = 0; i < rank; ++i) n *= dims[i];
    return n;
  }
  bool operator==(const Shape& o) const {
    if (rank != o.rank) return false;
    for (int i = 0; i < rank; ++i)
      if (dims[i] != o.dims[i]) return false;
    return true;
  }
  std::string str() const {
    std::string s = "[";
    for (int i = 0; i < rank; ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
    return s + "]";
  }
};

struct Tensor {
  void* data = nullptr;
  Shape shape;
  DType dtype = DType::f32;
  Device device = Device::cpu;

  int64_t numel() const { return shape.numel(); }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
  // Rows = all leading dims flattened; cols = the last dim.
  int64_t cols() const { return shape.rank ? shape[shape.rank - 1] : 1; }
  int64_t rows() const { return cols() ? numel() / cols() : 0; }
  bool empty() const { return data == nullptr; }
};

}  // namespace bottle
