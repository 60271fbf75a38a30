// Conversions, indices and elementwise kernels. The maps (one output element from the same
// element of each input) move kPack elements per thread with 128-bit loads and stores when
// every array is 16-byte aligned, element by element otherwise and for the tail; the others
// run one thread per element (row_dot: one warp per row). Grids are one wave of the device
// (device_grid_for) with a grid-stride loop. Every element is loaded as fp32, computed in fp32
// and rounded once on store, so one kernel serves every mix of f32 and bf16 arrays.
//
// Aliasing (out may be an input): each element is read and written by the same thread, which
// loads all its inputs (a whole pack) before it stores, so no pointer is declared __restrict__.
#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// Calls op(i) for every i < n; the grid is capped (grid_for), the loop covers the rest.
template <typename Op>
__global__ void for_each_kernel(Op op, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) op(i);
}

template <typename Op>
void for_each(cudaStream_t stream, int64_t n, const Op& op) {
  if (n <= 0) return;
  for_each_kernel<<<device_grid_for(n, kThreads), kThreads, 0, stream>>>(op, n);
}

// out_b[i] = f(in_0[i], ..., in_{kIn-1}[i])_b for every i < n: f is a functor with
// `void operator()(const float (&x)[kIn], float (&y)[kOut]) const`, on fp32 values.
template <int kIn, int kOut, typename F>
struct Map {
  Array out[kOut];
  ConstArray in[kIn];
  F f;

  __device__ __forceinline__ void element(int64_t i) const {
    float x[kIn], y[kOut];
#pragma unroll
    for (int a = 0; a < kIn; ++a) x[a] = load(in[a], i);
    f(x, y);
#pragma unroll
    for (int b = 0; b < kOut; ++b) store(out[b], i, y[b]);
  }
  __device__ __forceinline__ void pack(int64_t i) const {
    Pack x[kIn], y[kOut];
#pragma unroll
    for (int a = 0; a < kIn; ++a) x[a] = load_pack(in[a], i);
#pragma unroll
    for (int e = 0; e < kPack; ++e) {
      float xe[kIn], ye[kOut];
#pragma unroll
      for (int a = 0; a < kIn; ++a) xe[a] = x[a].v[e];
      f(xe, ye);
#pragma unroll
      for (int b = 0; b < kOut; ++b) y[b].v[e] = ye[b];
    }
#pragma unroll
    for (int b = 0; b < kOut; ++b) store_pack(out[b], i, y[b]);
  }
};

// Thread t takes pack t, t + stride, ...; a pack is whole (packed) or the array's tail.
template <bool kPacked, int kIn, int kOut, typename F>
__global__ void map_kernel(Map<kIn, kOut, F> m, int64_t n) {
  const int64_t packs = (n + kPack - 1) / kPack;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < packs; p += stride) {
    const int64_t first = p * kPack;
    if (kPacked && first + kPack <= n) {
      m.pack(first);
    } else {
      const int64_t end = first + kPack < n ? first + kPack : n;
      for (int64_t i = first; i < end; ++i) m.element(i);
    }
  }
}

template <int kIn, int kOut, typename F>
void map(cudaStream_t stream, int64_t n, const Map<kIn, kOut, F>& m) {
  if (n <= 0) return;
  bool aligned = true;
  for (const Array& a : m.out) aligned = aligned && packable({a.data});
  for (const ConstArray& a : m.in) aligned = aligned && packable({a.data});
  const unsigned blocks = device_grid_for((n + kPack - 1) / kPack, kThreads);
  if (aligned)
    map_kernel<true><<<blocks, kThreads, 0, stream>>>(m, n);
  else
    map_kernel<false><<<blocks, kThreads, 0, stream>>>(m, n);
}

// The maps' functions. An output that is also read (dst += ...) is passed twice: as the Array
// written and as a ConstArray read, because ConstArray's converting constructor is host-only.

struct Identity {
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const { y[0] = x[0]; }
};
struct Sum {
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = x[0] + x[1]; }
};
struct Product {
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = x[0] * x[1]; }
};
struct Quotient {
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const { y[0] = x[0] / x[1]; }
};
struct Scaled {
  float factor;
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const { y[0] = x[0] * factor; }
};
struct RmsFromSumSquares {
  float count, eps;
  bool reciprocal;
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const {
    y[0] = kmath::rms_from_sum_squares(x[0], count, eps, reciprocal);
  }
};
struct Silu {  // x
  __device__ void operator()(const float (&x)[1], float (&y)[1]) const {
    y[0] = kmath::silu(x[0], sigmoid(x[0]));
  }
};
// The backward maps write their gradients: they are the only producers (backend.h).
struct SiluGrad {  // dout, x
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    y[0] = kmath::silu_dx(x[0], x[1], sigmoid(x[1]));
  }
};
struct Swiglu {  // gate, up
  bool gate_act;
  __device__ void operator()(const float (&x)[2], float (&y)[1]) const {
    const float s = gate_act ? sigmoid(x[0]) : 0.0f;  // unused without the activation
    y[0] = kmath::swiglu(x[0], x[1], s, gate_act);
  }
};
struct SwigluGrad {  // dout, gate, up → dgate, dup
  bool gate_act;
  __device__ void operator()(const float (&x)[3], float (&y)[2]) const {
    const float d = x[0], g = x[1], u = x[2];
    const float s = gate_act ? sigmoid(g) : 0.0f;
    y[0] = kmath::swiglu_dgate(d, g, u, s, gate_act);
    y[1] = kmath::swiglu_dup(d, g, s, gate_act);
  }
};

// The maps' inputs and outputs are whole arrays; these two index them otherwise, one thread
// per element.

// Element i of the rows × cols block being copied.
struct ConvertColumns {
  Array dst;       // [rows, dst_cols]
  ConstArray src;  // [rows, src_cols]
  int64_t dst_cols, dst_col, src_cols, src_col, cols;
  __device__ void operator()(int64_t i) const {
    const int64_t r = i / cols, j = i - r * cols;
    store(dst, r * dst_cols + dst_col + j, load(src, r * src_cols + src_col + j));
  }
};

struct ScaleRows {
  Array out;          // [rows, cols]
  ConstArray x;       // [rows, cols]
  ConstArray factor;  // [rows]
  int64_t cols;
  __device__ void operator()(int64_t i) const {
    store(out, i, load(x, i) * load(factor, i / cols));
  }
};

// Each thread walks its strided indices in increasing order, so its first hit is its
// smallest and it stops there; the atomicMin over the hits is order-independent, so the result
// is deterministic. Integer atomics only.
__global__ void first_outside_kernel(const int32_t* ids, int64_t n, int64_t lo, int64_t hi,
                                     unsigned long long* result) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t id = ids[i];
    if (id < lo || id >= hi) {
      atomicMin(result, static_cast<unsigned long long>(i));
      return;
    }
  }
}

// One warp per row: lane l sums columns l, l + 32, ... in order in fp32, then the warp's
// butterfly (warp_sum) adds the 32 partial sums; the order depends on cols alone.
__global__ void row_dot_kernel(Array out, ConstArray a, ConstArray b, int64_t rows, int64_t cols) {
  const int lane = threadIdx.x % kWarp;
  const int64_t warps_per_block = blockDim.x / kWarp;
  const int64_t stride = int64_t(gridDim.x) * warps_per_block;
  for (int64_t r = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / kWarp; r < rows;
       r += stride) {
    const int64_t base = r * cols;
    float sum = 0.0f;
    for (int64_t j = lane; j < cols; j += kWarp) sum += load(a, base + j) * load(b, base + j);
    sum = warp_sum(sum);
    if (lane == 0) store(out, r, sum);
  }
}

}  // namespace

void convert(cudaStream_t stream, Array dst, ConstArray src, int64_t n) {
  map(stream, n, Map<1, 1, Identity>{{dst}, {src}, {}});
}

void convert_columns(cudaStream_t stream, Array dst, int64_t dst_cols, int64_t dst_col,
                     ConstArray src, int64_t src_cols, int64_t src_col, int64_t rows,
                     int64_t cols) {
  if (cols <= 0) return;
  for_each(stream, rows * cols,
           ConvertColumns{dst, src, dst_cols, dst_col, src_cols, src_col, cols});
}

// Precondition: the caller has set *result = n (stream-ordered before this launch; the
// backend copies it in). The kernel only lowers it, so it stays n when every id is inside.
void first_outside(cudaStream_t stream, const int32_t* ids, int64_t n, int64_t lo, int64_t hi,
                   unsigned long long* result) {
  if (n <= 0) return;
  first_outside_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(ids, n, lo, hi, result);
}

void add(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n) {
  map(stream, n, Map<2, 1, Sum>{{out}, {a, b}, {}});
}

void accumulate(cudaStream_t stream, Array dst, ConstArray src, int64_t n) {
  map(stream, n, Map<2, 1, Sum>{{dst}, {ConstArray(dst), src}, {}});
}

void scale(cudaStream_t stream, Array x, float factor, int64_t n) {
  map(stream, n, Map<1, 1, Scaled>{{x}, {ConstArray(x)}, {factor}});
}

void multiply(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n) {
  map(stream, n, Map<2, 1, Product>{{out}, {a, b}, {}});
}

void divide(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n) {
  map(stream, n, Map<2, 1, Quotient>{{out}, {a, b}, {}});
}

void rms_from_sum_squares(cudaStream_t stream, Array out, ConstArray sumsq, int64_t n, float count,
                          float eps, bool reciprocal) {
  map(stream, n, Map<1, 1, RmsFromSumSquares>{{out}, {sumsq}, {count, eps, reciprocal}});
}

void scale_rows(cudaStream_t stream, Array out, ConstArray x, ConstArray factor, int64_t rows,
                int64_t cols) {
  if (cols <= 0) return;
  for_each(stream, rows * cols, ScaleRows{out, x, factor, cols});
}

void row_dot(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t rows,
             int64_t cols) {
  if (rows <= 0) return;
  constexpr int kRowsPerBlock = kThreads / kWarp;
  row_dot_kernel<<<grid_for(rows, kRowsPerBlock), kThreads, 0, stream>>>(out, a, b, rows, cols);
}

void silu_forward(cudaStream_t stream, Array out, ConstArray x, int64_t n) {
  map(stream, n, Map<1, 1, Silu>{{out}, {x}, {}});
}

void silu_backward(cudaStream_t stream, Array dx, ConstArray dout, ConstArray x, int64_t n) {
  map(stream, n, Map<2, 1, SiluGrad>{{dx}, {dout, x}, {}});
}

void swiglu_forward(cudaStream_t stream, Array out, ConstArray gate, ConstArray up, int64_t n,
                    bool gate_act) {
  map(stream, n, Map<2, 1, Swiglu>{{out}, {gate, up}, {gate_act}});
}

void swiglu_backward(cudaStream_t stream, Array dgate, Array dup, ConstArray dout, ConstArray gate,
                     ConstArray up, int64_t n, bool gate_act) {
  map(stream, n, Map<3, 2, SwigluGrad>{{dgate, dup}, {dout, gate, up}, {gate_act}});
}

}  // namespace bottle::cuda
