#include "core/host_backend.h"

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

void HostBackend::to_host(void* dst, Tensor src) {
  BOTTLE_CHECK(src.device == Device::cpu, "{}: to_host of a {} tensor", name(),
               device_name(src.device));
  if (src.nbytes()) std::memcpy(dst, src.data, src.nbytes());
}

void HostBackend::from_host(Tensor dst, const void* src) {
  BOTTLE_CHECK(dst.device == Device::cpu, "{}: from_host into a {} tensor", name(),
               device_name(dst.device));
  if (dst.nbytes()) std::memcpy(dst.data, src, dst.nbytes());
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
