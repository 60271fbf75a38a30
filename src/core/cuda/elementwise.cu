// Conversions, indices and elementwise kernels: one thread per element in a grid-stride loop
// (row_dot: one warp per row). Every element is loaded as fp32, computed in fp32 and rounded
// once on store, so one kernel serves every mix of f32 and bf16 arrays.
//
// Aliasing (out may be an input): each element is read and written by the same thread, which
// loads all its inputs before it stores, so no pointer is declared __restrict__.
#include "core/cuda/common.cuh"

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
  for_each_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(op, n);
}

// The functors below hold the arrays by value (they are the kernel's parameters). An output
// that is also read (dst += ...) is passed twice: as the Array written and as a ConstArray
// read, because ConstArray's converting constructor is host-only.

struct Convert {
  Array dst;
  ConstArray src;
  __device__ void operator()(int64_t i) const { store(dst, i, load(src, i)); }
};

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

struct Add {
  Array out;
  ConstArray a, b;
  __device__ void operator()(int64_t i) const { store(out, i, load(a, i) + load(b, i)); }
};

struct Accumulate {
  Array dst;
  ConstArray dst_in, src;  // dst_in: dst, read
  __device__ void operator()(int64_t i) const { store(dst, i, load(dst_in, i) + load(src, i)); }
};

struct Scale {
  Array x;
  ConstArray x_in;
  float factor;
  __device__ void operator()(int64_t i) const { store(x, i, load(x_in, i) * factor); }
};

struct Multiply {
  Array out;
  ConstArray a, b;
  __device__ void operator()(int64_t i) const { store(out, i, load(a, i) * load(b, i)); }
};

struct Divide {
  Array out;
  ConstArray a, b;
  __device__ void operator()(int64_t i) const { store(out, i, load(a, i) / load(b, i)); }
};

struct RmsFromSumSquares {
  Array out;
  ConstArray sumsq;
  float count, eps;
  bool reciprocal;
  __device__ void operator()(int64_t i) const {
    store(out, i, kmath::rms_from_sum_squares(load(sumsq, i), count, eps, reciprocal));
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

struct SiluForward {
  Array out;
  ConstArray x;
  __device__ void operator()(int64_t i) const {
    const float xv = load(x, i);
    store(out, i, kmath::silu(xv, sigmoid(xv)));
  }
};

// The backward kernels write their gradients: they are the only producers (backend.h).
struct SiluBackward {
  Array dx;
  ConstArray dout, x;
  __device__ void operator()(int64_t i) const {
    const float xv = load(x, i);
    store(dx, i, kmath::silu_dx(load(dout, i), xv, sigmoid(xv)));
  }
};

struct SwigluForward {
  Array out;
  ConstArray gate, up;
  bool gate_act;
  __device__ void operator()(int64_t i) const {
    const float g = load(gate, i);
    const float s = gate_act ? sigmoid(g) : 0.0f;  // unused without the activation
    store(out, i, kmath::swiglu(g, load(up, i), s, gate_act));
  }
};

struct SwigluBackward {
  Array dgate, dup;
  ConstArray dout, gate, up;
  bool gate_act;
  __device__ void operator()(int64_t i) const {
    const float d = load(dout, i), g = load(gate, i), u = load(up, i);
    const float s = gate_act ? sigmoid(g) : 0.0f;
    store(dgate, i, kmath::swiglu_dgate(d, g, u, s, gate_act));
    store(dup, i, kmath::swiglu_dup(d, g, s, gate_act));
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
  for_each(stream, n, Convert{dst, src});
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
  for_each(stream, n, Add{out, a, b});
}

void accumulate(cudaStream_t stream, Array dst, ConstArray src, int64_t n) {
  for_each(stream, n, Accumulate{dst, ConstArray(dst), src});
}

void scale(cudaStream_t stream, Array x, float factor, int64_t n) {
  for_each(stream, n, Scale{x, ConstArray(x), factor});
}

void multiply(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n) {
  for_each(stream, n, Multiply{out, a, b});
}

void divide(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n) {
  for_each(stream, n, Divide{out, a, b});
}

void rms_from_sum_squares(cudaStream_t stream, Array out, ConstArray sumsq, int64_t n, float count,
                          float eps, bool reciprocal) {
  for_each(stream, n, RmsFromSumSquares{out, sumsq, count, eps, reciprocal});
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
  for_each(stream, n, SiluForward{out, x});
}

void silu_backward(cudaStream_t stream, Array dx, ConstArray dout, ConstArray x, int64_t n) {
  for_each(stream, n, SiluBackward{dx, dout, x});
}

void swiglu_forward(cudaStream_t stream, Array out, ConstArray gate, ConstArray up, int64_t n,
                    bool gate_act) {
  for_each(stream, n, SwigluForward{out, gate, up, gate_act});
}

void swiglu_backward(cudaStream_t stream, Array dgate, Array dup, ConstArray dout, ConstArray gate,
                     ConstArray up, int64_t n, bool gate_act) {
  for_each(stream, n, SwigluBackward{dgate, dup, dout, gate, up, gate_act});
}

}  // namespace bottle::cuda
