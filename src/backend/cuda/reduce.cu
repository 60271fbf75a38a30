// Σ x[i] or Σ x[i]² to one double, bit for bit repeatable: a fixed grid of kPartials blocks
// (never sized from the device), each summing a fixed strided subset of the elements, then one
// block summing the partials in a fixed order. Which element lands in which thread, and the
// order of every addition, depend on n alone.
#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

// Enough blocks to fill any current GPU several times over; a constant, so the summation
// order does not depend on the device the run happens to get.
constexpr int kPartials = 1024;
constexpr int kThreads = 256;
constexpr int kFinalThreads = 256;

// partials[block] = the sum over i = block * kThreads + t + k * kPartials * kThreads of x[i]
// (or x[i]²): each thread adds its elements in increasing k, then block_sum combines the
// threads. The grid-stride layout keeps the loads coalesced.
__global__ void partial_sums_kernel(ConstArray x, int64_t n, bool squares, double* partials) {
  __shared__ double shared[kThreads / kWarp];
  const int64_t stride = int64_t(kPartials) * kThreads;
  double sum = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < n; i += stride) {
    const double v = load(x, i);
    sum += squares ? v * v : v;
  }
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) partials[blockIdx.x] = sum;
}

// *result = Σ partials[p], thread t summing p = t, t + kFinalThreads, ... then block_sum.
__global__ void final_sum_kernel(const double* partials, double* result) {
  __shared__ double shared[kFinalThreads / kWarp];
  double sum = 0.0;
  for (int p = threadIdx.x; p < kPartials; p += kFinalThreads) sum += partials[p];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) *result = sum;
}

// Up to kMaxSlots sums at once: partials[block * slots + s] for slot s. Each block walks every
// range and, inside it, the same strided subset of elements as partial_sums_kernel does for a
// whole tensor, so the order of additions depends on the ranges alone.
constexpr int kMaxSlots = 4;

__global__ void range_partials_kernel(ConstArray x, const SlotRange* ranges, int64_t range_count,
                                      int slots, double* partials) {
  __shared__ double shared[kThreads / kWarp];
  const int64_t stride = int64_t(kPartials) * kThreads;
  double sums[kMaxSlots] = {0.0, 0.0, 0.0, 0.0};
  for (int64_t r = 0; r < range_count; ++r) {
    const SlotRange range = ranges[r];
    double sum = 0.0;
    for (int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x; i < range.count; i += stride) {
      const double v = load(x, range.offset + i);
      sum += v * v;
    }
    // The slot is uniform over the block: no divergence.
    for (int s = 0; s < kMaxSlots; ++s)
      if (s == range.slot) sums[s] += sum;
  }
  for (int s = 0; s < slots; ++s) {
    const double total = block_sum(sums[s], shared);
    if (threadIdx.x == 0) partials[int64_t(blockIdx.x) * slots + s] = total;
  }
}

// out[s] = Σ_p partials[p * slots + s], one block per slot.
__global__ void range_final_kernel(const double* partials, int slots, double* out) {
  __shared__ double shared[kFinalThreads / kWarp];
  double sum = 0.0;
  for (int p = threadIdx.x; p < kPartials; p += kFinalThreads)
    sum += partials[int64_t(p) * slots + blockIdx.x];
  sum = block_sum(sum, shared);
  if (threadIdx.x == 0) out[blockIdx.x] = sum;
}

__global__ void accumulate_mean_kernel(double* acc, const double* sum, int64_t n) {
  *acc += double(float(*sum / double(n)));
}

__global__ void scalar_kernel(double* out, const double* a, const double* b, double divisor,
                              ScalarOp op) {
  switch (op) {
    case ScalarOp::add:
      *out = *a + *b;
      break;
    case ScalarOp::divide:
      *out = *a / divisor;
      break;
    case ScalarOp::sqrt:
      *out = sqrt(*a);
      break;
  }
}

__global__ void clip_kernel(float* control, const double* loss, const double* norm,
                            double max_norm) {
  const double l = *loss, n = *norm;
  control[1] = isfinite(l) && isfinite(n) ? 1.0f : 0.0f;
  control[0] = max_norm > 0 && n > max_norm ? float(max_norm / (n + 1e-6)) : 1.0f;
}

__global__ void convert_scalars_kernel(void* dst, DType dst_dtype, const void* src, DType src_dtype,
                                       int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const double v = src_dtype == DType::f64 ? static_cast<const double*>(src)[i]
                                             : double(static_cast<const float*>(src)[i]);
    if (dst_dtype == DType::f64)
      static_cast<double*>(dst)[i] = v;
    else
      static_cast<float*>(dst)[i] = float(v);
  }
}

}  // namespace

int reduce_partials_count() { return kPartials; }
int reduce_max_slots() { return kMaxSlots; }

void sum_squares_ranges(cudaStream_t stream, double* out, int slots, ConstArray x,
                        const SlotRange* ranges, int64_t range_count, double* partials) {
  range_partials_kernel<<<kPartials, kThreads, 0, stream>>>(x, ranges, range_count, slots,
                                                            partials);
  range_final_kernel<<<slots, kFinalThreads, 0, stream>>>(partials, slots, out);
}

void accumulate_mean(cudaStream_t stream, double* acc, ConstArray x, int64_t n, double* partials,
                     double* sum) {
  reduce_sum(stream, x, n, false, partials, sum);
  accumulate_mean_kernel<<<1, 1, 0, stream>>>(acc, sum, n);
}

void scalar_op(cudaStream_t stream, double* out, const double* a, const double* b, double divisor,
               ScalarOp op) {
  scalar_kernel<<<1, 1, 0, stream>>>(out, a, b, divisor, op);
}

void clip_and_check(cudaStream_t stream, float* control, const double* loss, const double* norm,
                    double max_norm) {
  clip_kernel<<<1, 1, 0, stream>>>(control, loss, norm, max_norm);
}

void convert_scalars(cudaStream_t stream, void* dst, DType dst_dtype, const void* src,
                     DType src_dtype, int64_t n) {
  if (n <= 0) return;
  convert_scalars_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(dst, dst_dtype, src,
                                                                         src_dtype, n);
}

// Launches even for n == 0 (the partials are then zeros), so *result is always written.
void reduce_sum(cudaStream_t stream, ConstArray x, int64_t n, bool squares, double* partials,
                double* result) {
  partial_sums_kernel<<<kPartials, kThreads, 0, stream>>>(x, n, squares, partials);
  final_sum_kernel<<<1, kFinalThreads, 0, stream>>>(partials, result);
}

}  // namespace bottle::cuda
