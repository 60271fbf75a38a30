#pragma once
// A Tensor is a non-owning view: pointer, dtype, device and a row-major shape. Memory is
// owned by arenas (arena.h), one per purpose, so that every byte is accounted to a tag.
#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace bottle {


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
  // Typed host access: only src/core (the backends) reads or writes tensor data
  // (tools/check_device_clean.sh enforces it); layers pass tensors to Backend kernels.
  float* f32() const { return static_cast<float*>(data); }
  int32_t* i32() const { return static_cast<int32_t*>(data); }
  uint16_t* bf16() const { return static_cast<uint16_t*>(data); }  // bit patterns (core/bf16.h)
  // Rows = all leading dims flattened; cols = the last dim.
  int64_t cols() const { return shape.rank ? shape[shape.rank - 1] : 1; }
  int64_t rows() const { return cols() ? numel() / cols() : 0; }
  bool empty() const { return data == nullptr; }

  // The address of element `index`: address arithmetic for views and GEMM operands, which
  // is valid on any device (nothing is read).
  void* at(int64_t index) const {
    return static_cast<char*>(data) + index * int64_t(dtype_size(dtype));
  }
  // A contiguous view of `shape` starting at element `offset`, within this tensor.
  Tensor view(int64_t offset, Shape view_shape) const {
    BOTTLE_CHECK(offset >= 0 && offset + view_shape.numel() <= numel(),
                 "view {} at element {} exceeds a tensor of {} elements", view_shape.str(), offset,
                 numel());
    return Tensor{at(offset), view_shape, dtype, device};
  }
  // The same elements seen with another shape of the same size.
  Tensor reshaped(Shape new_shape) const {
    BOTTLE_CHECK(new_shape.numel() == numel(), "cannot view {} as {}", shape.str(),
                 new_shape.str());
    return Tensor{data, new_shape, dtype, device};
  }
};

// A host buffer seen as a tensor, for what works on host memory: a communicator's staging
// (checkpoint gathers, a check's inputs), the safetensors writer. Never for Backend kernels,
// whose tensors come from an Arena on their own device.
inline Tensor host_tensor(std::span<float> host) {
  return Tensor{host.data(), {int64_t(host.size())}, DType::f32, Device::cpu};
}
inline Tensor host_tensor(std::span<int32_t> host) {
  return Tensor{host.data(), {int64_t(host.size())}, DType::i32, Device::cpu};
}

}  // namespace bottle
