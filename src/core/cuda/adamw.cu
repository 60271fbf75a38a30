// AdamW with decoupled weight decay on fp32 masters, gradients and moments: one thread per
// element (grid-stride), the step itself is kmath::adamw_step, shared with the CPU backends.
#include "core/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// param, grad, m, v: [n] fp32. The scalars travel by value as a kernel parameter.
__global__ void adamw_kernel(float* param, const float* grad, float* m, float* v, int64_t n,
                             kmath::AdamWScalars scalars) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float p = param[i], mi = m[i], vi = v[i];
    kmath::adamw_step(p, grad[i], mi, vi, scalars);
    param[i] = p;
    m[i] = mi;
    v[i] = vi;
  }
}

}  // namespace

void adamw_update(cudaStream_t stream, float* param, const float* grad, float* m, float* v,
                  int64_t n, const AdamWParams& args) {
  if (n <= 0) return;
  // The bias corrections on the host, with the host's powf, as the CPU backend computes them.
  const kmath::AdamWScalars scalars{args.lr,
                                    args.beta1,
                                    args.beta2,
                                    args.eps,
                                    args.weight_decay,
                                    args.grad_scale,
                                    kmath::adamw_bias_correction(args.beta1, args.step),
                                    kmath::adamw_bias_correction(args.beta2, args.step)};
  adamw_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, grad, m, v, n, scalars);
}

}  // namespace bottle::cuda
