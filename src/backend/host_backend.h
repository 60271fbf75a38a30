#pragma once
// Host memory for the backends that compute on the CPU (cpu, reference): aligned, zeroed
// allocations and staging that is a plain copy, since host and device are one memory.
#include "backend/backend.h"

namespace bottle {

class HostBackend : public Backend {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes, const char* what) override;
  void deallocate(void* p, size_t bytes) override;
  // Staging, a plain copy, and the device scalars, the same for every host backend: each
  // range's sum of squares is the backend's own sum_squares and the mean its own sum, so the
  // values are exactly those the host used to read back one by one. The rest (the kernels) is
  // each host backend's own.
#define BOTTLE_BACKEND_OP(...)
#define BOTTLE_STAGING_OP(ret, op, params, call, traffic) ret do_##op params override;
#define BOTTLE_SCALAR_OP BOTTLE_STAGING_OP
#define BOTTLE_INTO_SCALAR_OP BOTTLE_STAGING_OP
#include "backend/backend_ops.def"

 protected:
  // copy's conversions between f32 and f64 (device scalars): true when it did one.
  static bool copy_scalars(Tensor dst, Tensor src);
};

// Fails, naming the backend, unless copy_columns' arguments stay inside both matrices.
void check_copy_columns(const char* backend, Tensor dst, int64_t dst_col, Tensor src,
                        int64_t src_col, int64_t cols);

}  // namespace bottle
