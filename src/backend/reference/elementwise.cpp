// Copies, token-range checks and elementwise kernels, one element at a time.
#include <cmath>

#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

namespace {

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

}  // namespace

void ReferenceBackend::do_copy(Tensor dst, Tensor src) {
  if (copy_scalars(dst, src)) return;
  BOTTLE_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(),
               "reference backend: copy of {} {} into {} {}", dtype_name(src.dtype),
               src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  const size_t size = dtype_size(dst.dtype);
  const auto* s = static_cast<const unsigned char*>(src.data);
  auto* o = static_cast<unsigned char*>(dst.data);
  for (size_t i = 0; i < src.nbytes(); i += size)
    for (size_t b = 0; b < size; ++b) o[i + b] = s[i + b];
}

void ReferenceBackend::do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                                       int64_t cols) {
  check_copy_columns("reference", dst, dst_col, src, src_col, cols);
  const int64_t size = int64_t(dtype_size(dst.dtype));
  const auto* s = static_cast<const unsigned char*>(src.data);
  auto* o = static_cast<unsigned char*>(dst.data);
  for (int64_t i = 0; i < dst.rows(); ++i)
    for (int64_t j = 0; j < cols; ++j)
      for (int64_t b = 0; b < size; ++b)
        o[((i * dst.cols()) + dst_col + j) * size + b] =
            s[((i * src.cols()) + src_col + j) * size + b];
}

int64_t ReferenceBackend::do_first_outside(Tensor ids, int64_t lo, int64_t hi) {
  need_dtype("first_outside", ids, DType::i32);
  for (int64_t i = 0; i < ids.numel(); ++i)
    if (ids.i32()[i] < lo || ids.i32()[i] >= hi) return i;
  return -1;
}

void ReferenceBackend::do_fill_zero(Tensor x) {
  if (x.dtype == DType::f64) {
    for (int64_t i = 0; i < x.numel(); ++i) static_cast<double*>(x.data)[i] = 0.0;
    return;
  }
  need_f32("fill_zero", {x});
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 0.0f;
}

void ReferenceBackend::do_add(Tensor out, Tensor a, Tensor b) {
  const char* k = "add";
  need_f32(k, {out, a, b});
  need_numel(k, b, a.numel(), "b");
  need_numel(k, out, a.numel(), "out");
  for (int64_t i = 0; i < a.numel(); ++i) out.f32()[i] = a.f32()[i] + b.f32()[i];
}

void ReferenceBackend::do_accumulate(Tensor dst, Tensor src) {
  const char* k = "accumulate";
  need_f32(k, {dst, src});
  need_numel(k, src, dst.numel(), "src");
  for (int64_t i = 0; i < dst.numel(); ++i) dst.f32()[i] += src.f32()[i];
}

void ReferenceBackend::do_scale(Tensor x, float factor) {
  need_f32("scale", {x});
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = x.f32()[i] * factor;
}

void ReferenceBackend::do_multiply(Tensor out, Tensor a, Tensor b) {
  need_f32("multiply", {out, a, b});
  for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] = a.f32()[i] * b.f32()[i];
}

void ReferenceBackend::do_divide(Tensor out, Tensor a, Tensor b) {
  need_f32("divide", {out, a, b});
  for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] = a.f32()[i] / b.f32()[i];
}

void ReferenceBackend::do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                               bool reciprocal) {
  need_f32("rms_from_sum_squares", {out, sumsq});
  for (int64_t i = 0; i < out.numel(); ++i) {
    const double rms = std::sqrt(double(sumsq.f32()[i]) / double(count) + double(eps));
    out.f32()[i] = float(reciprocal ? 1.0 / rms : rms);
  }
}

void ReferenceBackend::do_scale_rows(Tensor out, Tensor x, Tensor factor) {
  const char* k = "scale_rows";
  need_f32(k, {out, x, factor});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, out, n * c, "out");
  need_numel(k, factor, n, "factor");
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < c; ++j)
      out.f32()[r * c + j] = float(double(x.f32()[r * c + j]) * factor.f32()[r]);
}

void ReferenceBackend::do_row_dot(Tensor out, Tensor a, Tensor b) {
  const char* k = "row_dot";
  need_f32(k, {out, a, b});
  const int64_t n = a.rows(), c = a.cols();
  need_numel(k, b, n * c, "b");
  need_numel(k, out, n, "out");
  for (int64_t r = 0; r < n; ++r) {
    double s = 0.0;
    for (int64_t j = 0; j < c; ++j) s += double(a.f32()[r * c + j]) * b.f32()[r * c + j];
    out.f32()[r] = float(s);
  }
}

void ReferenceBackend::do_silu_forward(Tensor out, Tensor x) {
  const char* k = "silu_forward";
  need_f32(k, {out, x});
  need_numel(k, out, x.numel(), "out");
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xv = x.f32()[i];
    out.f32()[i] = float(xv * sigmoid(xv));
  }
}

void ReferenceBackend::do_silu_backward(Tensor dx, Tensor dout, Tensor x) {
  const char* k = "silu_backward";
  need_f32(k, {dx, dout, x});
  need_numel(k, dx, x.numel(), "dx");
  need_numel(k, dout, x.numel(), "dout");
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xv = x.f32()[i], s = sigmoid(xv);
    dx.f32()[i] = float(dout.f32()[i] * s * (1.0 + xv * (1.0 - s)));
  }
}

void ReferenceBackend::do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) {
  const char* k = "swiglu_forward";
  need_f32(k, {out, gate, up});
  need_numel(k, up, gate.numel(), "up");
  need_numel(k, out, gate.numel(), "out");
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double g = gate.f32()[i];
    const double act = gate_act ? g * sigmoid(g) : g;
    out.f32()[i] = float(act * up.f32()[i]);
  }
}

void ReferenceBackend::do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate,
                                          Tensor up, bool gate_act) {
  const char* k = "swiglu_backward";
  need_f32(k, {dgate, dup, dout, gate, up});
  need_numel(k, up, gate.numel(), "up");
  need_numel(k, dgate, gate.numel(), "dgate");
  need_numel(k, dup, gate.numel(), "dup");
  need_numel(k, dout, gate.numel(), "dout");
  for (int64_t i = 0; i < gate.numel(); ++i) {
    const double g = gate.f32()[i], s = sigmoid(g);
    const double act = gate_act ? g * s : g;
    const double dact = gate_act ? s * (1.0 + g * (1.0 - s)) : 1.0;
    const double go = dout.f32()[i];
    dgate.f32()[i] = float(go * up.f32()[i] * dact);
    dup.f32()[i] = float(go * act);
  }
}

}  // namespace bottle
