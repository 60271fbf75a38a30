#pragma once
// The CUDA module, libbottle_cuda.so: the cuda backend, its kernels and cuDNN's attention, the
// one part of bottle that links the CUDA runtime and cuBLASLt (backend/gpu_module.h says how
// it is found and opened). The backend registry reaches it only through this table, which the
// module's extern "C" entry point bottle_cuda_module() returns (cuda_module.cpp; a
// GpuModuleEntry, so it returns it as a const void*).
//
// Free of CUDA headers: the registry includes it in every build that has CUDA.
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/backend_options.h"

namespace bottle::cuda {

inline constexpr const char* kModuleFile = "libbottle_cuda.so";
inline constexpr const char* kModuleEntry = "bottle_cuda_module";

struct ModuleApi {
  // First, so that the loader can read it before anything else: the interface fingerprint the
  // module was built with (generated/gpu_module_abi.h).
  const char* abi;
  // cuda_unavailable(): why this process cannot use a GPU, or empty.
  std::string (*unavailable)();
  // make_cuda_backend() with this build's cuDNN attention, if it has one.
  std::unique_ptr<Backend> (*make_backend)(AttentionChoice attention);
  // cuda_description(), for `bottle --version`.
  std::string (*description)();
  // Which attention a bf16 GPU run would get, without a GPU: cuDNN's with its library, or the
  // own kernels and why.
  std::string (*attention_status)();
};

}  // namespace bottle::cuda
