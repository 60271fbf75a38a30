#pragma once
// What every .cu file of the CUDA backend shares: element loads and stores by dtype, block
// reductions in a fixed order, and launch geometry. Included by nvcc-compiled files only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "core/cuda/kernels.h"
#include "core/kernel_math.h"

namespace bottle::cuda {

// Element i of an array as fp32. The dtype is uniform over a launch, so the branch costs a
// warp nothing.
__device__ __forceinline__ float load(ConstArray a, int64_t i) {
  if (a.dtype == DType::bf16) return __bfloat162float(static_cast<const __nv_bfloat16*>(a.data)[i]);
  return static_cast<const float*>(a.data)[i];
}
// An output read back (the += of backward kernels).
__device__ __forceinline__ float load(Array a, int64_t i) { return load(ConstArray(a), i); }
// Stores v rounded once to the array's dtype (nearest even, as kmath::bf16_from_float).
__device__ __forceinline__ void store(Array a, int64_t i, float v) {
  if (a.dtype == DType::bf16)
    static_cast<__nv_bfloat16*>(a.data)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(a.data)[i] = v;
}

constexpr int kWarp = 32;

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ double warp_sum(double v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2)
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  return v;
}

// The sum of one value per thread over the block, returned to every thread. The order of
// the additions depends on blockDim alone, so results repeat bit for bit. `shared` holds at
// least blockDim.x / 32 values; the block must be a multiple of 32 threads.
template <typename T>
__device__ __forceinline__ T block_sum(T v, T* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_sum(v);
  __syncthreads();  // `shared` may still be read by a previous reduction
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : T(0);
  return warp_sum(v);
}
// The same for the maximum.
__device__ __forceinline__ float block_max(float v, float* shared) {
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  v = lane < warps ? shared[lane] : -INFINITY;
  return warp_max(v);
}

// A 1-D grid covering n elements with `threads` per block, capped so that a grid-stride
// loop covers the rest.
inline unsigned grid_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  return unsigned(blocks < 65535 * 16 ? (blocks > 0 ? blocks : 1) : 65535 * 16);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

}  // namespace bottle::cuda
