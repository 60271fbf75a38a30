#pragma once
// bf16 storage on a host backend whose kernels compute in fp32: each kernel's bf16 tensors
// are widened into fp32 scratch (exactly: a bf16 value is an fp32 value), the fp32 kernel
// runs, and its bf16 outputs are rounded back to nearest even. So a bf16 run stores what a
// native bf16 kernel that computes in fp32 would store, and on the reference backend this is
// the exact oracle of it. GEMMs go to the wrapped backend as bf16 where it runs them on bf16
// instructions (bf16_gemm_path()), else widened the same way. make_backend wraps the reference
// in it, and the cpu backend as "cpu-widened": the cpu kernels as bf16 ran before they took it
// themselves, kept as a fallback and as the bits tests/backend/test_bf16_host_kernels.cpp holds the
// native kernels to.
//
// The scratch lives as long as one kernel call; it grows to the largest call's operands and
// is counted as workspace memory.
#include <memory>
#include <string>
#include <vector>

#include "backend/forwarding_backend.h"

namespace bottle {

class WideningBackend final : public ForwardingBackend {
 public:
  explicit WideningBackend(std::unique_ptr<Backend> inner);
  ~WideningBackend() override;
  std::string bf16_unsupported() const override { return {}; }
  std::string bf16_gemm_path() const override;

  // The ops that take bf16 tensors (backend/backend_ops.def's kernels and reductions into device
  // scalars); the rest (staging, ids, the device scalars, AdamW's fp32 state) are the inner
  // backend's as they are.
#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic) ret do_##op params override;
#define BOTTLE_STAGING_OP(...)
#define BOTTLE_FIXED_DTYPE_OP(...)
#define BOTTLE_SCALAR_OP(...)
#include "backend/backend_ops.def"

 private:
  class Widened;
  std::vector<float>& scratch(size_t index, size_t elements);

  bool native_gemm_ = false;
  // One buffer per tensor widened within a kernel call, reused by the next call.
  std::vector<std::vector<float>> scratch_;
  size_t scratch_in_use_ = 0;
};

}  // namespace bottle
