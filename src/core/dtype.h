#pragma once
// Element types and devices. Free of fmt and the standard library's heavier headers, so that
// nvcc-compiled kernels (src/backend/cuda) share the same enums with the host code.
#include <cstddef>
#include <cstdint>

namespace bottle {

// f64 holds a step's scalars on the device (loss, gradient norm, clip factor: Backend's
// device scalars); no kernel but those and copy takes it.
enum class DType : uint8_t { f32, bf16, i32, f64 };
// Where a tensor's bytes live: the backend that allocated them says (Backend::device()).
enum class Device : uint8_t { cpu, cuda };
inline const char* device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

inline size_t dtype_size(DType t) { return t == DType::bf16 ? 2 : t == DType::f64 ? 8 : 4; }
inline const char* dtype_name(DType t) {
  return t == DType::f32 ? "f32" : t == DType::bf16 ? "bf16" : t == DType::i32 ? "i32" : "f64";
}

}  // namespace bottle
