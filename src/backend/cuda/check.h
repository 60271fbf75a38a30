#pragma once
// The cuda backend's checks of CUDA and cuBLASLt calls: a failed call stops the op with the
// library's own words and the name of what was being done.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <string_view>

#include "core/error.h"

namespace bottle::cuda {

inline void check_cuda(cudaError_t status, std::string_view what) {
  if (status != cudaSuccess)
    fail("cuda backend: {}: {} ({})", what, cudaGetErrorString(status), cudaGetErrorName(status));
}

inline void check_cublas(cublasStatus_t status, std::string_view what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    fail("cuda backend: {}: cuBLASLt error {} ({})", what, int(status),
         cublasLtGetStatusString(status));
}

}  // namespace bottle::cuda
