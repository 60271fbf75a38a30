// RMSNorm (whole rows, the online-RMSNorm shard variant and the fused residual form) and
// LayerNorm, forward and backward, with the row statistics in double.
#include <cmath>

#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

namespace {

// out = x * weight / sqrt(Σx²/C + eps) per row; keeps rstd and/or Σx² where given.
void rmsnorm_rows(const char* k, Tensor out, Tensor rstd, Tensor sumsq, Tensor x, Tensor weight,
                  float eps) {
  need_f32(k, {out, x, weight});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, out, n * c, "out");
  need_numel(k, weight, c, "weight");
  if (!rstd.empty()) need_numel(k, rstd, n, "rstd");
  if (!sumsq.empty()) need_numel(k, sumsq, n, "sumsq");
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    double ss = 0.0;
    for (int64_t j = 0; j < c; ++j) ss += double(xr[j]) * xr[j];
    const double rs = 1.0 / std::sqrt(ss / double(c) + eps);
    if (!rstd.empty()) rstd.f32()[r] = float(rs);
    if (!sumsq.empty()) sumsq.f32()[r] = float(ss);
    for (int64_t j = 0; j < c; ++j) out.f32()[r * c + j] = float(xr[j] * rs * weight.f32()[j]);
  }
}

// y_j = x_j * rs * w_j over a row of d columns, of which x holds C; d rs / d x_j =
// -rs^3 x_j / d. dot[r] = Σ over the d columns of g w x: given, or (C = d) from the row.
void rmsnorm_backward_rows(const char* k, Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                           Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  need_f32(k, {dx, dweight, dout, x, weight, rstd});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, dx, n * c, "dx");
  need_numel(k, dout, n * c, "dout");
  need_numel(k, dweight, c, "dweight");
  need_numel(k, weight, c, "weight");
  need_numel(k, rstd, n, "rstd");
  if (!dot.empty()) need_numel(k, dot, n, "dot");
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    const float* gr = dout.f32() + r * c;
    const double rs = rstd.f32()[r];
    double row_dot = 0.0;
    if (dot.empty())
      for (int64_t j = 0; j < c; ++j) row_dot += double(gr[j]) * weight.f32()[j] * xr[j];
    else
      row_dot = dot.f32()[r];
    const double kk = rs * rs * rs * row_dot / double(d);
    for (int64_t j = 0; j < c; ++j) {
      dx.f32()[r * c + j] += float(double(gr[j]) * weight.f32()[j] * rs - xr[j] * kk);
      dweight.f32()[j] += float(double(gr[j]) * xr[j] * rs);
    }
  }
}

}  // namespace

void ReferenceBackend::do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight,
                                          float eps) {
  rmsnorm_rows("rmsnorm_forward", out, rstd, Tensor{}, x, weight, eps);
}

// The oracle composes the two ops it fuses.
void ReferenceBackend::do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x,
                                                   Tensor residual, Tensor weight, float eps) {
  add(sum, x, residual);
  rmsnorm_forward(out, rstd, sum, weight, eps);
}

void ReferenceBackend::do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                                float eps) {
  rmsnorm_rows("rmsnorm_shard_forward", out, Tensor{}, sumsq, x, weight, eps);
}

void ReferenceBackend::do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                           Tensor weight, Tensor rstd) {
  rmsnorm_backward_rows("rmsnorm_backward", dx, dweight, dout, x, weight, rstd, Tensor{}, x.cols());
}

void ReferenceBackend::do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                                 Tensor weight, Tensor rstd, Tensor dot,
                                                 int64_t d) {
  rmsnorm_backward_rows("rmsnorm_shard_backward", dx, dweight, dout, x, weight, rstd, dot, d);
}

void ReferenceBackend::do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x,
                                            Tensor weight, Tensor bias, float eps) {
  const char* k = "layernorm_forward";
  need_f32(k, {out, mean, rstd, x, weight, bias});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, out, n * c, "out");
  need_numel(k, mean, n, "mean");
  need_numel(k, rstd, n, "rstd");
  need_numel(k, weight, c, "weight");
  need_numel(k, bias, c, "bias");
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    double mu = 0.0;
    for (int64_t j = 0; j < c; ++j) mu += xr[j];
    mu /= double(c);
    double var = 0.0;  // biased
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    var /= double(c);
    const double rs = 1.0 / std::sqrt(var + eps);
    mean.f32()[r] = float(mu);
    rstd.f32()[r] = float(rs);
    for (int64_t j = 0; j < c; ++j) {
      out.f32()[r * c + j] = float((xr[j] - mu) * rs * weight.f32()[j] + bias.f32()[j]);
    }
  }
}

void ReferenceBackend::do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                                             Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  const char* k = "layernorm_backward";
  need_f32(k, {dx, dweight, dbias, dout, x, weight, mean, rstd});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, dx, n * c, "dx");
  need_numel(k, dout, n * c, "dout");
  need_numel(k, dweight, c, "dweight");
  need_numel(k, dbias, c, "dbias");
  need_numel(k, weight, c, "weight");
  need_numel(k, mean, n, "mean");
  need_numel(k, rstd, n, "rstd");
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    const float* gr = dout.f32() + r * c;
    const double mu = mean.f32()[r], rs = rstd.f32()[r];
    // xhat = (x - mu) * rs; dxhat = g * w;
    // dx = rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
    double mean_dxhat = 0.0, mean_dxhat_xhat = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mu) * rs;
      const double dxhat = double(gr[j]) * weight.f32()[j];
      mean_dxhat += dxhat;
      mean_dxhat_xhat += dxhat * xhat;
    }
    mean_dxhat /= double(c);
    mean_dxhat_xhat /= double(c);
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mu) * rs;
      const double dxhat = double(gr[j]) * weight.f32()[j];
      dx.f32()[r * c + j] = float(rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
      dweight.f32()[j] += float(gr[j] * xhat);
      dbias.f32()[j] += gr[j];
    }
  }
}

}  // namespace bottle
