#pragma once
// Host memory for the backends that compute on the CPU (cpu, reference): aligned, zeroed
// allocations and staging that is a plain copy, since host and device are one memory.
#include "core/backend.h"

namespace bottle {

class HostBackend : public Backend {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes, const char* what) override;
  void deallocate(void* p, size_t bytes) override;
  void do_to_host(void* dst, Tensor src) override;
  void do_from_host(Tensor dst, const void* src) override;

  // Device scalars, the same for every host backend: each range's sum of squares is the
  // backend's own sum_squares and the mean its own sum, so the values are exactly those the
  // host used to read back one by one.
  void do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) override;
  void do_accumulate_mean(Tensor acc, Tensor x) override;
  void do_scalar_add(Tensor out, Tensor a, Tensor b) override;
  void do_scalar_divide(Tensor out, Tensor a, double divisor) override;
  void do_scalar_sqrt(Tensor out, Tensor a) override;
  void do_clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) override;

 protected:
  // copy's conversions between f32 and f64 (device scalars): true when it did one.
  static bool copy_scalars(Tensor dst, Tensor src);
};

// Fails, naming the backend, unless copy_columns' arguments stay inside both matrices.
void check_copy_columns(const char* backend, Tensor dst, int64_t dst_col, Tensor src,
                        int64_t src_col, int64_t cols);

}  // namespace bottle
