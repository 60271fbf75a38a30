#pragma once
// What every .cu file of the CUDA backend shares: element loads and stores by dtype, block
// reductions in a fixed order, and launch geometry. Included by nvcc-compiled files only.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>

#include "backend/cuda/kernels.h"
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

// --- Packs: kPack consecutive elements moved with 128-bit accesses (one in bf16, two in f32),
// the unit of the vectorised kernels. A pack starts at an element index that is a multiple of
// kPack in an array whose base is 16-byte aligned (packable()); the rest of an array, or an
// array that is not aligned, goes element by element through load() and store().
constexpr int kPack = 8;
struct Pack {
  float v[kPack];
};

__device__ __forceinline__ Pack load_pack(ConstArray a, int64_t i) {
  Pack p;
  if (a.dtype == DType::bf16) {
    const uint4 raw =
        *reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(a.data) + i);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < kPack / 2; ++k) {
      const float2 f = __bfloat1622float2(h[k]);
      p.v[2 * k] = f.x, p.v[2 * k + 1] = f.y;
    }
  } else {
    const float4* f = reinterpret_cast<const float4*>(static_cast<const float*>(a.data) + i);
    const float4 lo = f[0], hi = f[1];
    p.v[0] = lo.x, p.v[1] = lo.y, p.v[2] = lo.z, p.v[3] = lo.w;
    p.v[4] = hi.x, p.v[5] = hi.y, p.v[6] = hi.z, p.v[7] = hi.w;
  }
  return p;
}
__device__ __forceinline__ Pack load_pack(Array a, int64_t i) {
  return load_pack(ConstArray(a), i);
}
// Each element rounded once to the array's dtype, as store() rounds it.
__device__ __forceinline__ void store_pack(Array a, int64_t i, const Pack& p) {
  if (a.dtype == DType::bf16) {
    uint4 raw;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
    for (int k = 0; k < kPack / 2; ++k) h[k] = __floats2bfloat162_rn(p.v[2 * k], p.v[2 * k + 1]);
    *reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(a.data) + i) = raw;
  } else {
    float4* f = reinterpret_cast<float4*>(static_cast<float*>(a.data) + i);
    f[0] = make_float4(p.v[0], p.v[1], p.v[2], p.v[3]);
    f[1] = make_float4(p.v[4], p.v[5], p.v[6], p.v[7]);
  }
}

// kW consecutive elements from i: one pack (kW == kPack, i on a pack boundary of a packable
// array) or one element (kW == 1). Kernels written over kW run either way, with the same code.
template <int kW>
__device__ __forceinline__ void load_lanes(ConstArray a, int64_t i, float (&v)[kW]) {
  if constexpr (kW == kPack) {
    const Pack p = load_pack(a, i);
#pragma unroll
    for (int e = 0; e < kW; ++e) v[e] = p.v[e];
  } else {
#pragma unroll
    for (int e = 0; e < kW; ++e) v[e] = load(a, i + e);
  }
}
template <int kW>
__device__ __forceinline__ void load_lanes(Array a, int64_t i, float (&v)[kW]) {
  load_lanes<kW>(ConstArray(a), i, v);
}
template <int kW>
__device__ __forceinline__ void store_lanes(Array a, int64_t i, const float (&v)[kW]) {
  if constexpr (kW == kPack) {
    Pack p;
#pragma unroll
    for (int e = 0; e < kW; ++e) p.v[e] = v[e];
    store_pack(a, i, p);
  } else {
#pragma unroll
    for (int e = 0; e < kW; ++e) store(a, i + e, v[e]);
  }
}

// Whether every base address is 16-byte aligned: then every pack of each array is (a bf16
// pack is 16 bytes, an f32 one 32). Views into arenas and column slices may not be.
inline bool packable(std::initializer_list<const void*> bases) {
  for (const void* p : bases)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  return true;
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

// The threads the device keeps resident at once (SMs × threads per SM), asked once: the process
// runs on one device.
inline int64_t resident_threads() {
  static const int64_t threads = [] {
    int device = 0, sms = 0, per_sm = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device) !=
            cudaSuccess)
      return int64_t(0);
    return int64_t(sms) * per_sm;
  }();
  return threads;
}

// A grid-stride grid for n work items of one thread each: one full wave of the device (every
// SM at full occupancy) or fewer blocks when the work is smaller, so a large launch neither
// queues thousands of blocks nor leaves SMs idle.
inline unsigned device_grid_for(int64_t n, int threads) {
  const int64_t wave = resident_threads() / threads;
  const int64_t blocks = (n + threads - 1) / threads;
  if (wave <= 0) return grid_for(n, threads);  // the device did not say: the plain grid
  return unsigned(blocks < wave ? (blocks > 0 ? blocks : 1) : wave);
}

__device__ __forceinline__ float sigmoid(float x) { return 1.0f / (1.0f + __expf(-x)); }

}  // namespace bottle::cuda
