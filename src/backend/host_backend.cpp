#include "backend/host_backend.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "core/arena.h"

namespace bottle {

void* HostBackend::allocate(size_t bytes, const char* what) {
  return host_memory().allocate(bytes, what);
}

void HostBackend::deallocate(void* p, size_t bytes) { host_memory().deallocate(p, bytes); }

void HostBackend::do_to_host(void* dst, Tensor src) {
  BOTTLE_ASSERT(src.device == Device::cpu, "{}: to_host of a {} tensor", name(),
                device_name(src.device));
  if (src.nbytes()) std::memcpy(dst, src.data, src.nbytes());
}

void HostBackend::do_from_host(Tensor dst, const void* src) {
  BOTTLE_ASSERT(dst.device == Device::cpu, "{}: from_host into a {} tensor", name(),
                device_name(dst.device));
  if (dst.nbytes()) std::memcpy(dst.data, src, dst.nbytes());
}

void HostBackend::do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) {
  double* o = static_cast<double*>(out.data);
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = 0.0;
  for (const SumRange& r : ranges) o[r.slot] += sum_squares(x.view(r.offset, {r.count}));
}

void HostBackend::do_accumulate_mean(Tensor acc, Tensor x) {
  *static_cast<double*>(acc.data) += double(float(sum(x) / double(x.numel())));
}

void HostBackend::do_scalar_add(Tensor out, Tensor a, Tensor b) {
  *static_cast<double*>(out.data) =
      *static_cast<const double*>(a.data) + *static_cast<const double*>(b.data);
}

void HostBackend::do_scalar_divide(Tensor out, Tensor a, double divisor) {
  *static_cast<double*>(out.data) = *static_cast<const double*>(a.data) / divisor;
}

void HostBackend::do_scalar_sqrt(Tensor out, Tensor a) {
  *static_cast<double*>(out.data) = std::sqrt(*static_cast<const double*>(a.data));
}

void HostBackend::do_clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) {
  const double l = *static_cast<const double*>(loss.data),
               n = *static_cast<const double*>(norm.data);
  float* c = control.f32();
  c[kControlApply] = std::isfinite(l) && std::isfinite(n) ? 1.0f : 0.0f;
  c[kControlScale] = max_norm > 0 && n > max_norm ? float(max_norm / (n + 1e-6)) : 1.0f;
}

bool HostBackend::copy_scalars(Tensor dst, Tensor src) {
  const bool down = dst.dtype == DType::f32 && src.dtype == DType::f64,
             up = dst.dtype == DType::f64 && src.dtype == DType::f32;
  if (!down && !up) return false;
  BOTTLE_ASSERT(dst.numel() == src.numel(), "copy of {} {} into {} {}", dtype_name(src.dtype),
                src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  for (int64_t i = 0; i < dst.numel(); ++i) {
    if (down)
      dst.f32()[i] = float(static_cast<const double*>(src.data)[i]);
    else
      static_cast<double*>(dst.data)[i] = double(src.f32()[i]);
  }
  return true;
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
