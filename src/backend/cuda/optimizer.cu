// The optimizers' element-wise updates. AdamW with decoupled weight decay on fp32 masters, gradients and moments, in one pass over
// the flat buffers (every parameter of a rank, or its ZeRO shard): the step itself is
// kmath::adamw_step, shared with the CPU backends. The same pass writes the compute copy (the
// bf16 weights the GEMMs read), so no second pass converts the masters, and reads the step's
// clip factor and skip flag from device memory, so the host never waits for the gradient norm.
#include "backend/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;  // elements per thread and iteration: one 128-bit load of fp32

// Whether element i decays: outside every no-decay range. The ranges are few (one per norm
// weight) and ascending, so a binary search per group of kVec elements is cheap; parameters
// start at multiples of kVec elements (the parameter store's 128-element alignment), so a
// group never straddles a range's end.
__device__ __forceinline__ bool decays(const DecayGap* gaps, int64_t count, int64_t i) {
  int64_t lo = 0, hi = count;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (gaps[mid].end <= i)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == count || i < gaps[lo].begin;
}

__device__ __forceinline__ void store_compute(Array compute, int64_t i, float p) {
  if (compute.data) store(compute, i, p);
}

// param, grad, m, v: [n] fp32; compute [n] f32 or bf16 (or no data); control f32 [2] or null.
__global__ void adamw_kernel(float* param, Array compute, const float* grad, float* m, float* v,
                             int64_t n, const float* control, const DecayGap* gaps,
                             int64_t gap_count, kmath::AdamWScalars scalars, bool vector) {
  if (control) {
    if (control[1] == 0.0f) return;  // a non-finite step: nothing changes
    scalars.grad_scale = control[0];
  }
  kmath::AdamWScalars no_decay = scalars;
  no_decay.weight_decay = 0.0f;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x * kVec;
  for (int64_t base = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVec; base < n;
       base += stride) {
    const kmath::AdamWScalars& s = decays(gaps, gap_count, base) ? scalars : no_decay;
    if (vector && base + kVec <= n) {
      float4 p = *reinterpret_cast<const float4*>(param + base);
      const float4 g = *reinterpret_cast<const float4*>(grad + base);
      float4 mi = *reinterpret_cast<const float4*>(m + base);
      float4 vi = *reinterpret_cast<const float4*>(v + base);
      kmath::adamw_step(p.x, g.x, mi.x, vi.x, s);
      kmath::adamw_step(p.y, g.y, mi.y, vi.y, s);
      kmath::adamw_step(p.z, g.z, mi.z, vi.z, s);
      kmath::adamw_step(p.w, g.w, mi.w, vi.w, s);
      *reinterpret_cast<float4*>(param + base) = p;
      *reinterpret_cast<float4*>(m + base) = mi;
      *reinterpret_cast<float4*>(v + base) = vi;
      store_compute(compute, base, p.x);
      store_compute(compute, base + 1, p.y);
      store_compute(compute, base + 2, p.z);
      store_compute(compute, base + 3, p.w);
      continue;
    }
    for (int64_t i = base; i < base + kVec && i < n; ++i) {
      const kmath::AdamWScalars& e = decays(gaps, gap_count, i) ? scalars : no_decay;
      float p = param[i], mi = m[i], vi = v[i];
      kmath::adamw_step(p, grad[i], mi, vi, e);
      param[i] = p;
      m[i] = mi;
      v[i] = vi;
      store_compute(compute, i, p);
    }
  }
}

bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace

void adamw_update(cudaStream_t stream, float* param, Array compute, const float* grad, float* m,
                  float* v, int64_t n, const float* control, const DecayGap* gaps,
                  int64_t gap_count, const AdamWParams& args) {
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
  const bool vector =
      args.gaps_on_groups && aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v);
  const unsigned blocks = grid_for((n + kVec - 1) / kVec, kThreads);
  adamw_kernel<<<blocks, kThreads, 0, stream>>>(param, compute, grad, m, v, n, control, gaps,
                                                gap_count, scalars, vector);
}

namespace {

// Muon's element-wise parts: a grid-stride loop each, one element per thread and iteration
// (they run once per step on the matrices alone; AdamW's vector path is not worth it here).
__global__ void muon_momentum_kernel(float* update, float* buffer, const float* grad, int64_t n,
                                     const float* control, kmath::MuonScalars s) {
  bool apply = true;
  if (control) {
    apply = control[1] != 0.0f;
    s.grad_scale = control[0];
  }
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float b = buffer[i], u;
    kmath::muon_momentum_step(u, b, grad[i], s);
    update[i] = u;
    if (apply) buffer[i] = b;
  }
}

__global__ void muon_normalize_kernel(float* x, int64_t n, const float* sumsq) {
  const float inverse = kmath::muon_inverse_norm(sumsq[0]);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    x[i] *= inverse;
}

__global__ void muon_apply_kernel(float* param, Array compute, const float* update, int64_t n,
                                  const float* control, float decay, float step) {
  if (control && control[1] == 0.0f) return;  // a non-finite step: nothing changes
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float p = kmath::muon_apply_step(param[i], update[i], decay, step);
    param[i] = p;
    store_compute(compute, i, p);
  }
}

}  // namespace

void muon_momentum(cudaStream_t stream, float* update, float* buffer, const float* grad, int64_t n,
                   const float* control, float momentum, float grad_scale, bool nesterov) {
  if (n <= 0) return;
  muon_momentum_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(
      update, buffer, grad, n, control, kmath::MuonScalars{momentum, grad_scale, nesterov});
}

void muon_normalize(cudaStream_t stream, float* x, int64_t n, const float* sumsq) {
  if (n <= 0) return;
  muon_normalize_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(x, n, sumsq);
}

void muon_apply(cudaStream_t stream, float* param, Array compute, const float* update, int64_t n,
                const float* control, float decay, float step) {
  if (n <= 0) return;
  muon_apply_kernel<<<grid_for(n, kThreads), kThreads, 0, stream>>>(param, compute, update, n,
                                                                    control, decay, step);
}

}  // namespace bottle::cuda
