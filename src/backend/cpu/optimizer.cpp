// The optimizers' element-wise updates. AdamW with decoupled weight decay, one pass over the
// fp32 masters, moments and gradients, writing the compute copy (bf16 rounded, or fp32) of
// each parameter as it is updated: the bf16 refresh of §18 costs no pass of its own. Muon's
// momentum, normalisation and update around its Newton–Schulz GEMMs.
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {
namespace {

// Runs body(i) for i in [0, n), split into one contiguous range per thread; the body is
// inlined into a plain loop that the compiler vectorizes ("omp parallel for simd" over
// captured pointers does not vectorize in GCC 12).
template <typename Body>
void parallel_elementwise(int64_t n, Body body) {
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) body(i);
  }
}

}  // namespace

void CpuBackend::do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                                 Tensor control, const AdamWArgs& a) {
  if (!control.empty() && control.f32()[kControlApply] == 0.0f) return;
  const float scale = control.empty() ? a.grad_scale : control.f32()[kControlScale];
  float *p = param.f32(), *g = grad.f32(), *ms = m.f32(), *vs = v.f32();
  const kmath::AdamWScalars decay{a.lr,
                                  a.beta1,
                                  a.beta2,
                                  a.eps,
                                  a.weight_decay,
                                  scale,
                                  kmath::adamw_bias_correction(a.beta1, a.step),
                                  kmath::adamw_bias_correction(a.beta2, a.step)};
  kmath::AdamWScalars no_decay = decay;
  no_decay.weight_decay = 0.0f;
  // The buffer alternates between decaying stretches and the no-decay ranges; each stretch
  // is one parallel pass that also writes the compute copy.
  auto run = [&](int64_t lo, int64_t hi, const kmath::AdamWScalars& s) {
    if (hi <= lo) return;
    if (compute.empty()) {
      parallel_elementwise(hi - lo, [=](int64_t j) {
        const int64_t i = lo + j;
        kmath::adamw_step(p[i], g[i], ms[i], vs[i], s);
      });
    } else if (compute.dtype == DType::bf16) {
      uint16_t* c = compute.bf16();
      parallel_elementwise(hi - lo, [=](int64_t j) {
        const int64_t i = lo + j;
        kmath::adamw_step(p[i], g[i], ms[i], vs[i], s);
        c[i] = bf16_from_float(p[i]);
      });
    } else {
      float* c = compute.f32();
      parallel_elementwise(hi - lo, [=](int64_t j) {
        const int64_t i = lo + j;
        kmath::adamw_step(p[i], g[i], ms[i], vs[i], s);
        c[i] = p[i];
      });
    }
  };
  int64_t at = 0;
  for (const ElementRange& r : a.no_decay) {
    run(at, r.offset, decay);
    run(r.offset, r.offset + r.count, no_decay);
    at = r.offset + r.count;
  }
  run(at, param.numel(), decay);
}

// Muon's element-wise parts (kernel_math.h's steps), one parallel pass each.
void CpuBackend::do_muon_momentum(Tensor update, Tensor buffer, Tensor grad, Tensor control,
                                  const MuonArgs& a) {
  const bool apply = control.empty() || control.f32()[kControlApply] != 0.0f;
  const kmath::MuonScalars s{
      a.momentum, control.empty() ? a.grad_scale : control.f32()[kControlScale], a.nesterov};
  float *u = update.f32(), *b = buffer.f32();
  const float* g = grad.f32();
  if (apply)
    parallel_elementwise(grad.numel(),
                         [=](int64_t i) { kmath::muon_momentum_step(u[i], b[i], g[i], s); });
  else  // a skipped step: the update alone, from a copy of the buffer
    parallel_elementwise(grad.numel(), [=](int64_t i) {
      float kept = b[i];
      kmath::muon_momentum_step(u[i], kept, g[i], s);
    });
}

void CpuBackend::do_muon_normalize(Tensor x, Tensor sumsq) {
  const float inverse = kmath::muon_inverse_norm(sumsq.f32()[0]);
  float* p = x.f32();
  parallel_elementwise(x.numel(), [=](int64_t i) { p[i] *= inverse; });
}

void CpuBackend::do_muon_apply(Tensor param, Tensor compute, Tensor update, Tensor control,
                               const MuonArgs& a) {
  if (!control.empty() && control.f32()[kControlApply] == 0.0f) return;
  const float decay = 1.0f - a.lr * a.weight_decay, step = a.lr * a.adjust;
  float* p = param.f32();
  const float* x = update.f32();
  if (compute.empty()) {
    parallel_elementwise(
        param.numel(), [=](int64_t i) { p[i] = kmath::muon_apply_step(p[i], x[i], decay, step); });
  } else if (compute.dtype == DType::bf16) {
    uint16_t* c = compute.bf16();
    parallel_elementwise(param.numel(), [=](int64_t i) {
      p[i] = kmath::muon_apply_step(p[i], x[i], decay, step);
      c[i] = bf16_from_float(p[i]);
    });
  } else {
    float* c = compute.f32();
    parallel_elementwise(param.numel(), [=](int64_t i) {
      p[i] = kmath::muon_apply_step(p[i], x[i], decay, step);
      c[i] = p[i];
    });
  }
}

}  // namespace bottle::cpu
