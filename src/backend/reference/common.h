#pragma once
// The checks every family of the reference backend makes of its operands: the dtype its
// kernels take, data present, and element counts. Included by src/backend/reference/*.cpp only.
#include <cstdint>
#include <initializer_list>
#include <string_view>

#include "core/error.h"
#include "core/tensor.h"

// In a namespace of their own: the other backends have checks of the same names.
namespace bottle::reference {

inline void need_dtype(std::string_view kernel, const Tensor& t, DType want) {
  if (t.dtype != want) {
    fail("reference backend: {} does not support dtype {}", kernel, dtype_name(t.dtype));
  }
  BOTTLE_CHECK(t.data != nullptr || t.numel() == 0, "reference backend: {}: null tensor data",
               kernel);
}

inline void need_f32(std::string_view kernel, std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts) need_dtype(kernel, t, DType::f32);
}

inline void need_numel(std::string_view kernel, const Tensor& t, int64_t n, const char* what) {
  BOTTLE_CHECK(t.numel() == n, "reference backend: {}: {} has {} elements {}, expected {}", kernel,
               what, t.numel(), t.shape.str(), n);
}

}  // namespace bottle::reference
