// Cross-entropy over rows of logits, whole-vocabulary and vocabulary-parallel. A row's
// statistics come from one block per row in a single read of the logits (an online softmax);
// the gradients are elementwise over a grid of rows by column slices. Logits are read in their
// own dtype, kPack elements per 128-bit load where a row is whole packs of aligned arrays
// (element by element otherwise): no fp32 copy of them is ever made.
#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kElementThreads = 256;
constexpr int kMaxRowThreads = 512;
// Columns each thread of a gradient block covers, so that a block amortises its row's loads
// of the target and statistics over several elements.
constexpr int kColumnsPerThread = 8;
constexpr unsigned kMaxGridY = 65535;

// The accurate expf: these are statistics that the loss and every gradient inherit.
struct Exp {
  __device__ __forceinline__ float operator()(float v) const { return expf(v); }
};

// A statistics block: wider for a long vocabulary row, so that fewer rows still fill the GPU.
// Depends on v alone, hence so does the order of the merges.
int row_threads(int64_t v) { return v >= 8192 ? kMaxRowThreads : kElementThreads; }

// Whether rows of v logits are whole packs of aligned arrays.
bool packed_rows(int64_t v, std::initializer_list<const void*> arrays) {
  return v % kPack == 0 && packable(arrays);
}

// A gradient grid: blockIdx.x is the row, blockIdx.y a slice of its columns (grid-strided
// where a row needs more than the y dimension's limit of slices).
dim3 row_slices_grid(int64_t rows, int64_t v) {
  const int64_t per_block = int64_t(kElementThreads) * kColumnsPerThread;
  int64_t slices = (v + per_block - 1) / per_block;
  slices = slices < 1 ? 1 : slices > kMaxGridY ? kMaxGridY : slices;
  return dim3(unsigned(rows), unsigned(slices));
}

// softmax_merge, made to carry a NaN logit through to the row's result. A NaN fails every
// comparison, so the max skips it and only the sum turns NaN; but softmax_merge drops a partial
// whose max is -inf whatever its sum, and a part of a row holding only -inf and NaN would be
// lost. A NaN max is never dropped, so a NaN sum sets it.
__device__ __forceinline__ void merge(kmath::SoftmaxState& s, float other_max, float other_sumexp) {
  kmath::softmax_merge(s, other_max, other_sumexp, Exp{});
  if (isnan(s.sumexp)) s.max = NAN;
}

__device__ __forceinline__ void warp_merge_down(kmath::SoftmaxState& s) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    const float other_max = __shfl_down_sync(0xffffffffu, s.max, offset);
    const float other_sumexp = __shfl_down_sync(0xffffffffu, s.sumexp, offset);
    merge(s, other_max, other_sumexp);
  }
}

// The online softmax state of logits[row, 0..v), returned to every thread. Each thread folds
// in its strided runs of kW elements in order, then the block merges lanes and warps in a tree
// fixed by blockDim; lane 0's result is broadcast so that every thread holds the very same bits.
template <int kW>
__device__ kmath::SoftmaxState row_softmax_state(ConstArray logits, int64_t row, int64_t v) {
  __shared__ float warp_max[kMaxRowThreads / kWarp], warp_sumexp[kMaxRowThreads / kWarp];
  __shared__ float result_max, result_sumexp;  // floats: a __shared__ has no initialiser
  kmath::SoftmaxState s;
  for (int64_t j = int64_t(threadIdx.x) * kW; j < v; j += int64_t(blockDim.x) * kW) {
    float x[kW];
    load_lanes<kW>(logits, row + j, x);
#pragma unroll
    for (int e = 0; e < kW; ++e) merge(s, x[e], 1.0f);
  }
  const int lane = threadIdx.x % kWarp, warp = threadIdx.x / kWarp;
  const int warps = blockDim.x / kWarp;
  warp_merge_down(s);
  if (lane == 0) {
    warp_max[warp] = s.max;
    warp_sumexp[warp] = s.sumexp;
  }
  __syncthreads();
  if (warp == 0) {
    kmath::SoftmaxState w;
    if (lane < warps) {
      w.max = warp_max[lane];
      w.sumexp = warp_sumexp[lane];
    }
    warp_merge_down(w);
    if (lane == 0) {
      result_max = w.max;
      result_sumexp = w.sumexp;
    }
  }
  __syncthreads();
  s.max = result_max;
  s.sumexp = result_sumexp;
  return s;
}

template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    cross_entropy_forward_kernel(Array losses, Array probs, ConstArray logits,
                                 const int32_t* targets, int64_t v) {
  const int64_t r = blockIdx.x, row = r * v;
  // Read before the state's barriers, after which probs (which may alias the logits) are
  // written.
  float target_logit = 0.0f;
  if (threadIdx.x == 0) {
    const int64_t t = targets[r];
    // An out-of-range target gives a NaN loss rather than a read outside the row.
    target_logit = t >= 0 && t < v ? load(logits, row + t) : NAN;
  }
  const kmath::SoftmaxState s = row_softmax_state<kW>(logits, row, v);
  if (threadIdx.x == 0) store(losses, r, kmath::cross_entropy_loss(s.sumexp, s.max, target_logit));
  const float inv_sumexp = 1.0f / s.sumexp;
  for (int64_t j = int64_t(threadIdx.x) * kW; j < v; j += int64_t(blockDim.x) * kW) {
    float x[kW];
    load_lanes<kW>(logits, row + j, x);
#pragma unroll
    for (int e = 0; e < kW; ++e) x[e] = expf(x[e] - s.max) * inv_sumexp;
    store_lanes<kW>(probs, row + j, x);
  }
}

template <int kW>
__global__ void __launch_bounds__(kMaxRowThreads)
    logits_row_stats_kernel(Array max, Array sumexp, ConstArray logits, int64_t v) {
  const int64_t r = blockIdx.x;
  const kmath::SoftmaxState s = row_softmax_state<kW>(logits, r * v, v);
  if (threadIdx.x != 0) return;
  store(max, r, s.max);  // NaN for a row with a NaN logit, as on the host backends
  store(sumexp, r, s.sumexp);
}

// Thread t of slice y takes the kW columns from kW (y · blockDim + t), then every
// kW · gridDim.y · blockDim further on.
#define BOTTLE_FOR_SLICE_LANES(j, v)                                               \
  for (int64_t j = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * kW; j < (v); \
       j += int64_t(gridDim.y) * blockDim.x * kW)

template <int kW>
__global__ void __launch_bounds__(kElementThreads)
    cross_entropy_backward_kernel(Array dlogits, ConstArray probs, const int32_t* targets,
                                  int64_t v, float scale) {
  const int64_t r = blockIdx.x, row = r * v;
  const int64_t t = targets[r];
  BOTTLE_FOR_SLICE_LANES(j, v) {
    float p[kW];
    load_lanes<kW>(probs, row + j, p);
#pragma unroll
    for (int e = 0; e < kW; ++e) p[e] = kmath::cross_entropy_dlogit(p[e], j + e == t, scale);
    store_lanes<kW>(dlogits, row + j, p);
  }
}

template <int kW>
__global__ void __launch_bounds__(kElementThreads)
    cross_entropy_shard_backward_kernel(Array dlogits, ConstArray logits, ConstArray max,
                                        ConstArray sumexp, const int32_t* targets, int64_t v,
                                        int64_t first, float scale) {
  const int64_t r = blockIdx.x, row = r * v;
  const int64_t t = int64_t(targets[r]) - first;
  const float mx = load(max, r), inv_sumexp = 1.0f / load(sumexp, r);
  BOTTLE_FOR_SLICE_LANES(j, v) {
    float x[kW];
    load_lanes<kW>(logits, row + j, x);
#pragma unroll
    for (int e = 0; e < kW; ++e)
      x[e] = kmath::cross_entropy_dlogit(expf(x[e] - mx) * inv_sumexp, j + e == t, scale);
    store_lanes<kW>(dlogits, row + j, x);
  }
}

#undef BOTTLE_FOR_SLICE_LANES

__global__ void cross_entropy_shard_partials_kernel(Array sumexp, Array target_logit,
                                                    ConstArray local_sumexp, ConstArray local_max,
                                                    ConstArray max, ConstArray logits,
                                                    const int32_t* targets, int64_t rows, int64_t v,
                                                    int64_t first) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    // Both inputs of row r are read before sumexp[r], which may alias local_max[r], is written.
    const float ls = load(local_sumexp, r), lm = load(local_max, r), mx = load(max, r);
    const int64_t t = int64_t(targets[r]) - first;
    const float tl = t >= 0 && t < v ? load(logits, r * v + t) : 0.0f;
    store(sumexp, r, kmath::rescaled_sumexp(ls, lm, mx, Exp{}));
    store(target_logit, r, tl);
  }
}

__global__ void cross_entropy_shard_losses_kernel(Array losses, ConstArray sumexp,
                                                  ConstArray target_logit, ConstArray max,
                                                  int64_t rows) {
  for (int64_t r = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; r < rows;
       r += int64_t(gridDim.x) * blockDim.x)
    store(losses, r,
          kmath::cross_entropy_loss(load(sumexp, r), load(max, r), load(target_logit, r)));
}

}  // namespace

void cross_entropy_forward(cudaStream_t stream, Array losses, Array probs, ConstArray logits,
                           const int32_t* targets, int64_t rows, int64_t v) {
  if (rows == 0) return;
  if (packed_rows(v, {probs.data, logits.data}))
    cross_entropy_forward_kernel<kPack>
        <<<unsigned(rows), row_threads(v), 0, stream>>>(losses, probs, logits, targets, v);
  else
    cross_entropy_forward_kernel<1>
        <<<unsigned(rows), row_threads(v), 0, stream>>>(losses, probs, logits, targets, v);
}

void cross_entropy_backward(cudaStream_t stream, Array dlogits, ConstArray probs,
                            const int32_t* targets, int64_t rows, int64_t v, float scale) {
  if (rows == 0) return;
  if (packed_rows(v, {dlogits.data, probs.data}))
    cross_entropy_backward_kernel<kPack><<<row_slices_grid(rows, v), kElementThreads, 0, stream>>>(
        dlogits, probs, targets, v, scale);
  else
    cross_entropy_backward_kernel<1><<<row_slices_grid(rows, v), kElementThreads, 0, stream>>>(
        dlogits, probs, targets, v, scale);
}

void logits_row_stats(cudaStream_t stream, Array max, Array sumexp, ConstArray logits, int64_t rows,
                      int64_t v) {
  if (rows == 0) return;
  if (packed_rows(v, {logits.data}))
    logits_row_stats_kernel<kPack>
        <<<unsigned(rows), row_threads(v), 0, stream>>>(max, sumexp, logits, v);
  else
    logits_row_stats_kernel<1>
        <<<unsigned(rows), row_threads(v), 0, stream>>>(max, sumexp, logits, v);
}

void cross_entropy_shard_backward(cudaStream_t stream, Array dlogits, ConstArray logits,
                                  ConstArray max, ConstArray sumexp, const int32_t* targets,
                                  int64_t rows, int64_t v, int64_t first, float scale) {
  if (rows == 0) return;
  if (packed_rows(v, {dlogits.data, logits.data}))
    cross_entropy_shard_backward_kernel<kPack>
        <<<row_slices_grid(rows, v), kElementThreads, 0, stream>>>(dlogits, logits, max, sumexp,
                                                                   targets, v, first, scale);
  else
    cross_entropy_shard_backward_kernel<1>
        <<<row_slices_grid(rows, v), kElementThreads, 0, stream>>>(dlogits, logits, max, sumexp,
                                                                   targets, v, first, scale);
}

void cross_entropy_shard_partials(cudaStream_t stream, Array sumexp, Array target_logit,
                                  ConstArray local_sumexp, ConstArray local_max, ConstArray max,
                                  ConstArray logits, const int32_t* targets, int64_t rows,
                                  int64_t v, int64_t first) {
  if (rows == 0) return;
  cross_entropy_shard_partials_kernel<<<grid_for(rows, kElementThreads), kElementThreads, 0,
                                        stream>>>(sumexp, target_logit, local_sumexp, local_max,
                                                  max, logits, targets, rows, v, first);
}

void cross_entropy_shard_losses(cudaStream_t stream, Array losses, ConstArray sumexp,
                                ConstArray target_logit, ConstArray max, int64_t rows) {
  if (rows == 0) return;
  cross_entropy_shard_losses_kernel<<<grid_for(rows, kElementThreads), kElementThreads, 0,
                                      stream>>>(losses, sumexp, target_logit, max, rows);
}

}  // namespace bottle::cuda
