#pragma once
// The reference backend: every kernel as the plainest naive loop, accumulating in double.
// Slow on purpose; tests use it as the oracle the fast backends are compared against.
//
// The class is declared here and defined one op family to a file in src/backend/reference/,
// the families of src/backend/cuda/ (plus gemm.cpp, which the CUDA backend leaves to
// cuBLASLt); the checks the families share are in src/backend/reference/common.h. Only f32
// float tensors and i32 token/target tensors are supported (WideningBackend feeds bf16).
#include <memory>
#include <string_view>

#include "backend/host_backend.h"

namespace bottle {

class ReferenceBackend final : public HostBackend {
 public:
  std::string_view name() const override { return "reference"; }

 protected:
  // Each kernel of backend/backend_ops.def, defined in the file of its family: gemm.cpp;
  // elementwise.cpp (copies, indices, elementwise kernels, rms_from_sum_squares, scale_rows,
  // row_dot); reduce.cpp (sum, sum_squares); embedding.cpp; norm.cpp (RMSNorm, its sharded and
  // fused variants, LayerNorm); rope.cpp; attention.cpp; cross_entropy.cpp; adamw.cpp. Staging
  // and the device scalars are HostBackend's.
#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic) ret do_##op params override;
#define BOTTLE_STAGING_OP(...)
#define BOTTLE_SCALAR_OP(...)
#define BOTTLE_INTO_SCALAR_OP(...)
#include "backend/backend_ops.def"
};

std::unique_ptr<Backend> make_reference_backend();

}  // namespace bottle
