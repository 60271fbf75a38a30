#pragma once
// fp32 / bf16 GEMMs on oneDNN's matmul primitive, one primitive per distinct problem,
// cached (creating a primitive costs far more than running a small one).
#include "core/backend.h"

namespace bottle {
void dnnl_gemm(const GemmArgs& args);
}  // namespace bottle
