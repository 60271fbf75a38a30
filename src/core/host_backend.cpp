#include "core/host_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/arena.h"

namespace bottle {

void* HostBackend::allocate(size_t bytes, const char* what) {
  const size_t rounded = aligned_size(bytes);
  void* p = std::aligned_alloc(kAllocationAlignment, rounded);
  BOTTLE_CHECK(p != nullptr, "out of memory allocating {} for {}", format_bytes(rounded), what);
  std::memset(p, 0, rounded);
  return p;
}

void HostBackend::deallocate(void* p, size_t) { std::free(p); }

void HostBackend::do_to_host(void* dst, Tensor src) {
  BOTTLE_CHECK(src.device == Device::cpu, "{}: to_host of a {} tensor", name(),
               device_name(src.device));
  if (src.nbytes()) std::memcpy(dst, src.data, src.nbytes());
}

void HostBackend::do_from_host(Tensor dst, const void* src) {
  BOTTLE_CHECK(dst.device == Device::cpu, "{}: from_host into a {} tensor", name(),
               device_name(dst.device));
  if (dst.nbytes()) std::memcpy(dst.data, src, dst.nbytes());
}

void HostBackend::do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) {
  check_sum_ranges(name().data(), out, x, ranges);
  double* o = static_cast<double*>(out.data);
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = 0.0;
  for (const SumRange& r : ranges) o[r.slot] += sum_squares(x.view(r.offset, {r.count}));
}

void HostBackend::do_accumulate_mean(Tensor acc, Tensor x) {
  check_scalar(name().data(), "accumulate_mean", acc, "acc");
  BOTTLE_CHECK(x.numel() > 0, "{} backend: accumulate_mean of an empty tensor", name());
  *static_cast<double*>(acc.data) += double(float(sum(x) / double(x.numel())));
}

void HostBackend::do_scalar_add(Tensor out, Tensor a, Tensor b) {
  for (const auto& [t, what] : {std::pair{&out, "out"}, {&a, "a"}, {&b, "b"}})
    check_scalar(name().data(), "scalar_add", *t, what);
  *static_cast<double*>(out.data) =
      *static_cast<const double*>(a.data) + *static_cast<const double*>(b.data);
}

void HostBackend::do_scalar_divide(Tensor out, Tensor a, double divisor) {
  check_scalar(name().data(), "scalar_divide", out, "out");
  check_scalar(name().data(), "scalar_divide", a, "a");
  *static_cast<double*>(out.data) = *static_cast<const double*>(a.data) / divisor;
}

void HostBackend::do_scalar_sqrt(Tensor out, Tensor a) {
  check_scalar(name().data(), "scalar_sqrt", out, "out");
  check_scalar(name().data(), "scalar_sqrt", a, "a");
  *static_cast<double*>(out.data) = std::sqrt(*static_cast<const double*>(a.data));
}

void HostBackend::do_clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) {
  check_control(name().data(), "clip_and_check", control);
  check_scalar(name().data(), "clip_and_check", loss, "loss");
  check_scalar(name().data(), "clip_and_check", norm, "norm");
  const double l = *static_cast<const double*>(loss.data), n = *static_cast<const double*>(norm.data);
  float* c = control.f32();
  c[kControlApply] = std::isfinite(l) && std::isfinite(n) ? 1.0f : 0.0f;
  c[kControlScale] = max_norm > 0 && n > max_norm ? float(max_norm / (n + 1e-6)) : 1.0f;
}

bool HostBackend::copy_scalars(Tensor dst, Tensor src) {
  const bool down = dst.dtype == DType::f32 && src.dtype == DType::f64,
             up = dst.dtype == DType::f64 && src.dtype == DType::f32;
  if (!down && !up) return false;
  BOTTLE_CHECK(dst.numel() == src.numel(), "copy of {} {} into {} {}", dtype_name(src.dtype),
               src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  for (int64_t i = 0; i < dst.numel(); ++i) {
    if (down)
      dst.f32()[i] = float(static_cast<const double*>(src.data)[i]);
    else
      static_cast<double*>(dst.data)[i] = double(src.f32()[i]);
  }
  return true;
}

void check_scalar(const char* backend, const char* op, const Tensor& t, const char* what) {
  BOTTLE_CHECK(t.dtype == DType::f64 && t.numel() == 1 && t.data != nullptr,
               "{} backend: {}: {} must be one f64 element, not {} {}", backend, op, what,
               dtype_name(t.dtype), t.shape.str());
}

void check_sum_ranges(const char* backend, const Tensor& out, const Tensor& x,
                      std::span<const SumRange> ranges) {
  BOTTLE_CHECK(out.dtype == DType::f64 && out.numel() >= 1 && out.data != nullptr,
               "{} backend: sum_squares_ranges: out must be f64, not {} {}", backend,
               dtype_name(out.dtype), out.shape.str());
  BOTTLE_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16,
               "{} backend: sum_squares_ranges takes an f32 or bf16 buffer, not {} {}", backend,
               dtype_name(x.dtype), x.shape.str());
  for (const SumRange& r : ranges)
    BOTTLE_CHECK(r.offset >= 0 && r.count >= 0 && r.offset + r.count <= x.numel() &&
                     r.slot >= 0 && r.slot < out.numel(),
                 "{} backend: sum_squares_ranges: range [{}, {}) into slot {} outside a buffer "
                 "of {} elements and {} slots",
                 backend, r.offset, r.offset + r.count, r.slot, x.numel(), out.numel());
}

void check_control(const char* backend, const char* op, const Tensor& control) {
  BOTTLE_CHECK(control.dtype == DType::f32 && control.numel() == kStepControlSize &&
                   control.data != nullptr,
               "{} backend: {}: the control tensor must be f32 [{}], not {} {}", backend, op,
               kStepControlSize, dtype_name(control.dtype), control.shape.str());
}

void check_adamw(const char* backend, Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                 Tensor control, const AdamWArgs& args) {
  const int64_t n = param.numel();
  for (const auto& [t, what] : {std::pair{&param, "param"}, {&grad, "grad"}, {&m, "m"}, {&v, "v"}})
    BOTTLE_CHECK(t->dtype == DType::f32 && t->numel() == n,
                 "{} backend: adamw_update: {} must be f32 with {} elements (param's), not {} {}",
                 backend, what, n, dtype_name(t->dtype), t->shape.str());
  BOTTLE_CHECK(compute.empty() || ((compute.dtype == DType::f32 || compute.dtype == DType::bf16) &&
                                   compute.numel() == n),
               "{} backend: adamw_update: the compute copy must be f32 or bf16 with {} elements, "
               "not {} {}",
               backend, n, dtype_name(compute.dtype), compute.shape.str());
  if (!control.empty()) check_control(backend, "adamw_update", control);
  BOTTLE_CHECK(args.step >= 1, "{} backend: adamw_update: step must be >= 1, got {}", backend,
               args.step);
  int64_t end = 0;
  for (const ElementRange& r : args.no_decay) {
    BOTTLE_CHECK(r.offset >= end && r.count >= 0 && r.offset + r.count <= n,
                 "{} backend: adamw_update: no-decay range [{}, {}) is not ascending inside [0, "
                 "{})",
                 backend, r.offset, r.offset + r.count, n);
    end = r.offset + r.count;
  }
}

void check_copy_columns(const char* backend, Tensor dst, int64_t dst_col, Tensor src,
                        int64_t src_col, int64_t cols) {
  BOTTLE_CHECK(
      dst.dtype == src.dtype && dst.rows() == src.rows() && cols >= 0 && dst_col >= 0 &&
          src_col >= 0 && dst_col + cols <= dst.cols() && src_col + cols <= src.cols(),
      "{} backend: copy_columns of {} columns from column {} of {} {} into column {} of {} {}",
      backend, cols, src_col, dtype_name(src.dtype), src.shape.str(), dst_col,
      dtype_name(dst.dtype), dst.shape.str());
}

}  // namespace bottle
