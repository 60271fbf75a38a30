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
  void to_host(void* dst, Tensor src) override;
  void from_host(Tensor dst, const void* src) override;
};

// Fails, naming the backend, unless copy_columns' arguments stay inside both matrices.
void check_copy_columns(const char* backend, Tensor dst, int64_t dst_col, Tensor src,
                        int64_t src_col, int64_t cols);

}  // namespace bottle
