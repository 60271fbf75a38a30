// Elementwise kernels: activations, sums, products, scaling. Each is one fp32 loop run over a
// thread's range of the operands (kernels.h: cpu::elementwise), on bf16 operands through
// tiles widened in L1 and rounded back once.
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {

void CpuBackend::do_silu_forward(Tensor out, Tensor x) {
  elementwise<2>(slab_ws_, x.numel(), {in(x), cpu::out(out)}, [](int64_t n, auto p) {
    const float* xs = p[0];
    float* os = p[1];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) os[i] = kmath::silu(xs[i], sigmoid(xs[i]));
  });
}

void CpuBackend::do_silu_backward(Tensor dx, Tensor dout, Tensor x) {
  // dx is written: its only producer (backend.h).
  elementwise<3>(slab_ws_, x.numel(), {cpu::out(dx), in(dout), in(x)}, [](int64_t n, auto p) {
    float* ds = p[0];
    const float *gs = p[1], *xs = p[2];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) ds[i] = kmath::silu_dx(gs[i], xs[i], sigmoid(xs[i]));
  });
}

void CpuBackend::do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) {
  // One loop per gate_act, so that the identity gate never computes a sigmoid.
  elementwise<3>(slab_ws_, gate.numel(), {cpu::out(out), in(gate), in(up)},
                 [gate_act](int64_t n, auto p) {
                   float* o = p[0];
                   const float *g = p[1], *u = p[2];
                   if (gate_act) {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i)
                       o[i] = kmath::swiglu(g[i], u[i], sigmoid(g[i]), true);
                   } else {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i)
                       o[i] = kmath::swiglu(g[i], u[i], 0.0f, false);
                   }
                 });
}

void CpuBackend::do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                                    bool gate_act) {
  // dgate and dup are written: their only producer (backend.h).
  elementwise<5>(slab_ws_, gate.numel(),
                 {cpu::out(dgate), cpu::out(dup), in(dout), in(gate), in(up)},
                 [gate_act](int64_t n, auto p) {
                   float *dg = p[0], *du = p[1];
                   const float *d = p[2], *g = p[3], *u = p[4];
                   if (gate_act) {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i) {
                       const float s = sigmoid(g[i]);
                       du[i] = kmath::swiglu_dup(d[i], g[i], s, true);
                       dg[i] = kmath::swiglu_dgate(d[i], g[i], u[i], s, true);
                     }
                   } else {
#pragma omp simd
                     for (int64_t i = 0; i < n; ++i) {
                       du[i] = kmath::swiglu_dup(d[i], g[i], 0.0f, false);
                       dg[i] = kmath::swiglu_dgate(d[i], g[i], u[i], 0.0f, false);
                     }
                   }
                 });
}

void CpuBackend::do_add(Tensor out, Tensor a, Tensor b) {
  elementwise<3>(slab_ws_, out.numel(), {cpu::out(out), in(a), in(b)}, [](int64_t n, auto p) {
    float* o = p[0];
    const float *x = p[1], *y = p[2];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  });
}

void CpuBackend::do_accumulate(Tensor dst, Tensor src) {
  elementwise<2>(slab_ws_, dst.numel(), {inout(dst), in(src)}, [](int64_t n, auto p) {
    float* o = p[0];
    const float* s = p[1];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] += s[i];
  });
}

// +0 is all zero bits in bf16 as in fp32 (and in i32).
void CpuBackend::do_fill_zero(Tensor x) {
  const size_t bytes = x.nbytes();
  char* base = static_cast<char*>(x.data);
#pragma omp parallel
  {
    const size_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const size_t begin = bytes * t / nt / 64 * 64,
                 end = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
    std::memset(base + begin, 0, end - begin);
  }
}

void CpuBackend::do_scale(Tensor x, float factor) {
  elementwise<1>(slab_ws_, x.numel(), {inout(x)}, [factor](int64_t n, auto p) {
    float* o = p[0];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] *= factor;
  });
}

void CpuBackend::do_multiply(Tensor out, Tensor a, Tensor b) {
  elementwise<3>(slab_ws_, out.numel(), {cpu::out(out), in(a), in(b)}, [](int64_t n, auto p) {
    float* o = p[0];
    const float *x = p[1], *y = p[2];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] * y[i];
  });
}

void CpuBackend::do_divide(Tensor out, Tensor a, Tensor b) {
  elementwise<3>(slab_ws_, out.numel(), {cpu::out(out), in(a), in(b)}, [](int64_t n, auto p) {
    float* o = p[0];
    const float *x = p[1], *y = p[2];
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] / y[i];
  });
}

}  // namespace bottle::cpu
