// RMSNorm (plain, fused with the residual add, and the vocabulary-sharded variants of §5),
// LayerNorm, and the row helpers of online RMSNorm (rms_from_sum_squares, scale_rows,
// row_dot). Each row is one thread's: its bf16 operands widened into the thread's slabs
// (Window), the row's statistics summed in fp32, its outputs rounded back once.
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {

// out = x * weight / sqrt(Σx²/C + eps) per row; keeps rstd and/or Σx² where given.
void CpuBackend::rmsnorm_rows(Tensor out, Tensor rstd, Tensor sumsq, Tensor x, Tensor weight,
                              float eps) {
  const int64_t n = x.rows(), c = x.cols();
  const Tensor w = widened(weight, weight_ws_);  // [c]
  const Slabs slabs(slab_ws_, kNormSlabs, c, any_bf16({out, x}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window xw(x, Access::read, slabs.get(0)), ow(out, Access::write, slabs.get(1));
    const float* xi = xw.at(i * c, c);
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) ss += xi[j] * xi[j];
    const float r = kmath::rstd_from_sum_squares(ss, float(c), eps);
    if (!rstd.empty()) store(rstd, i, r);
    if (!sumsq.empty()) store(sumsq, i, ss);
    float* oi = ow.at(i * c, c);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * r * w.f32()[j];
  }
}

void CpuBackend::do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  rmsnorm_rows(out, rstd, Tensor{}, x, weight, eps);
}

void CpuBackend::do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                          float eps) {
  rmsnorm_rows(out, Tensor{}, sumsq, x, weight, eps);
}

// One pass over each row: the sum is written as it is formed, and its squares summed. The
// normalised row is computed from the fp32 sum, not from the rounded one a bf16 sum stores.
void CpuBackend::do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x,
                                             Tensor residual, Tensor weight, float eps) {
  const int64_t n = x.rows(), c = x.cols();
  const Tensor w = widened(weight, weight_ws_);  // [c]
  const Slabs slabs(slab_ws_, kResidualNormSlabs, c, any_bf16({sum, out, x, residual}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window xw(x, Access::read, slabs.get(0)), rw(residual, Access::read, slabs.get(1)),
        sw(sum, Access::write, slabs.get(2)), ow(out, Access::write, slabs.get(3));
    const float *xi = xw.at(i * c, c), *ri = rw.at(i * c, c);
    float* si = sw.at(i * c, c);
    float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < c; ++j) {
      si[j] = xi[j] + ri[j];
      ss += si[j] * si[j];
    }
    const float r = kmath::rstd_from_sum_squares(ss, float(c), eps);
    store(rstd, i, r);
    float* oi = ow.at(i * c, c);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) oi[j] = si[j] * r * w.f32()[j];
  }
}

void CpuBackend::add_partials(Tensor dweight, const float* partial, int threads, int64_t stride,
                              int64_t c) {
  if (dweight.dtype != DType::bf16) {
    for (int t = 0; t < threads; ++t)
      for (int64_t j = 0; j < c; ++j) dweight.f32()[j] += partial[size_t(t) * stride + j];
    return;
  }
  // A bf16 gradient is summed in fp32 over the threads and rounded once.
  for (int64_t j = 0; j < c; ++j) {
    float acc = load(dweight, j);
    for (int t = 0; t < threads; ++t) acc += partial[size_t(t) * stride + j];
    store(dweight, j, acc);
  }
}

// RMSNorm backward over C of a row's d columns; dot[i] = Σ over the d columns of g w x,
// given, or (empty, C = d) computed from the row.
void CpuBackend::rmsnorm_backward_rows(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                       Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  const int64_t n = x.rows(), c = x.cols();
  const int nt = omp_get_max_threads();
  float* partial = dweight_ws_.get(size_t(nt) * kRmsNormPartials * c);  // [threads, c]
  std::memset(partial, 0, sizeof(float) * nt * kRmsNormPartials * c);
  const Tensor w = widened(weight, weight_ws_);  // [c]
  const Slabs slabs(slab_ws_, kNormBackwardSlabs, c, any_bf16({dx, dout, x}));
#pragma omp parallel
  {
    float* dw = partial + size_t(omp_get_thread_num()) * c;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      Window xw(x, Access::read, slabs.get(0)), gw(dout, Access::read, slabs.get(1)),
          dxw(dx, Access::read_write, slabs.get(2));
      const float* xi = xw.at(i * c, c);
      const float* gi = gw.at(i * c, c);
      float* dxi = dxw.at(i * c, c);
      const float r = load(rstd, i);
      float row_dot = 0.0f;
      if (!dot.empty()) {
        row_dot = load(dot, i);
      } else {
#pragma omp simd reduction(+ : row_dot)
        for (int64_t j = 0; j < c; ++j) row_dot += gi[j] * w.f32()[j] * xi[j];
      }
      const float k = kmath::rmsnorm_dx_row_factor(r, row_dot, float(d));
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) {
        dxi[j] += kmath::rmsnorm_dx_from_factor(gi[j], xi[j], w.f32()[j], r, k);
        dw[j] += gi[j] * xi[j] * r;
      }
    }
  }
  add_partials(dweight, partial, nt, c, c);
}

void CpuBackend::do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                     Tensor weight, Tensor rstd) {
  rmsnorm_backward_rows(dx, dweight, dout, x, weight, rstd, Tensor{}, x.cols());
}

void CpuBackend::do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                           Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  rmsnorm_backward_rows(dx, dweight, dout, x, weight, rstd, dot, d);
}

void CpuBackend::do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                                      Tensor bias, float eps) {
  const int64_t n = x.rows(), c = x.cols();
  const Tensor w = widened(weight, weight_ws_);  // [c]
  const Tensor bs = widened(bias, bias_ws_);     // [c]
  const Slabs slabs(slab_ws_, kNormSlabs, c, any_bf16({out, x}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window xw(x, Access::read, slabs.get(0)), ow(out, Access::write, slabs.get(1));
    const float* xi = xw.at(i * c, c);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < c; ++j) s += xi[j];
    const float mu = s / float(c);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < c; ++j) v += (xi[j] - mu) * (xi[j] - mu);
    const float r = kmath::rstd_from_sum_squares(v, float(c), eps);
    store(mean, i, mu);
    store(rstd, i, r);
    float* oi = ow.at(i * c, c);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) oi[j] = (xi[j] - mu) * r * w.f32()[j] + bs.f32()[j];
  }
}

void CpuBackend::do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                                       Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  const int64_t n = x.rows(), c = x.cols();
  const int nt = omp_get_max_threads();
  // [threads, 2 (dweight, dbias), c]
  float* partial = dweight_ws_.get(size_t(nt) * kLayerNormPartials * c);
  std::memset(partial, 0, sizeof(float) * nt * kLayerNormPartials * c);
  const Tensor w = widened(weight, weight_ws_);  // [c]
  const Slabs slabs(slab_ws_, kNormBackwardSlabs, c, any_bf16({dx, dout, x}));
#pragma omp parallel
  {
    float* dw = partial + size_t(omp_get_thread_num()) * 2 * c;
    float* db = dw + c;
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      Window xw(x, Access::read, slabs.get(0)), gw(dout, Access::read, slabs.get(1)),
          dxw(dx, Access::write, slabs.get(2));  // dx written: its only producer (backend.h)
      const float* xi = xw.at(i * c, c);
      const float* gi = gw.at(i * c, c);
      float* dxi = dxw.at(i * c, c);
      const float mu = load(mean, i), r = load(rstd, i);
      float sum_g = 0.0f, sum_gx = 0.0f;  // over j of (g w) and (g w) * xhat
#pragma omp simd reduction(+ : sum_g, sum_gx)
      for (int64_t j = 0; j < c; ++j) {
        const float gw = gi[j] * w.f32()[j];
        sum_g += gw;
        sum_gx += gw * (xi[j] - mu) * r;
      }
      sum_g /= float(c);
      sum_gx /= float(c);
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) {
        const float xhat = (xi[j] - mu) * r;
        dxi[j] = kmath::layernorm_dx(gi[j] * w.f32()[j], xhat, r, sum_g, sum_gx);
        dw[j] += gi[j] * xhat;
        db[j] += gi[j];
      }
    }
  }
  add_partials(dweight, partial, nt, 2 * c, c);
  add_partials(dbias, partial + c, nt, 2 * c, c);
}

void CpuBackend::do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                         bool reciprocal) {
  elementwise<2>(slab_ws_, out.numel(), {cpu::out(out), in(sumsq)}, [=](int64_t n, auto p) {
    float* o = p[0];
    const float* s = p[1];
    for (int64_t i = 0; i < n; ++i)
      o[i] = kmath::rms_from_sum_squares(s[i], count, eps, reciprocal);
  });
}

void CpuBackend::do_scale_rows(Tensor out, Tensor x, Tensor factor) {
  const int64_t n = x.rows(), c = x.cols();
  const Slabs slabs(slab_ws_, kRowSlabs, c, any_bf16({out, x}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window xw(x, Access::read, slabs.get(0)), ow(out, Access::write, slabs.get(1));
    const float f = load(factor, i);
    const float* xi = xw.at(i * c, c);
    float* oi = ow.at(i * c, c);
#pragma omp simd
    for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * f;
  }
}

void CpuBackend::do_row_dot(Tensor out, Tensor a, Tensor b) {
  const int64_t n = a.rows(), c = a.cols();
  const Slabs slabs(slab_ws_, kRowSlabs, c, any_bf16({a, b}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window aw(a, Access::read, slabs.get(0)), bw(b, Access::read, slabs.get(1));
    const float* ai = aw.at(i * c, c);
    const float* bi = bw.at(i * c, c);
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < c; ++j) s += ai[j] * bi[j];
    store(out, i, s);
  }
}

}  // namespace bottle::cpu
