// Σ x[i] or Σ x[i]² to one double, bit for bit repeatable: a fixed grid of kPartials blocks
// (never sized from the device), each summing a fixed strided subset of the elements, then one
// block summing the partials in a fixed order. Which element lands in which thread, and the
// order of every addition, depend on n alone.
#include "core/cuda/common.cuh"

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

}  // namespace

int reduce_partials_count() { return kPartials; }

// Launches even for n == 0 (the partials are then zeros), so *result is always written.
void reduce_sum(cudaStream_t stream, ConstArray x, int64_t n, bool squares, double* partials,
                double* result) {
  partial_sums_kernel<<<kPartials, kThreads, 0, stream>>>(x, n, squares, partials);
  final_sum_kernel<<<1, kFinalThreads, 0, stream>>>(partials, result);
}

}  // namespace bottle::cuda
