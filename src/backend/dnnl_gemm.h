#pragma once
// fp32 / bf16 GEMMs on oneDNN's matmul primitive, one primitive per distinct problem,
// cached (creating a primitive costs far more than running a small one).
#include <string>

#include "backend/backend.h"

namespace bottle {
void dnnl_gemm(const GemmArgs& args);
// The oneDNN implementation that runs bf16 x bf16 -> fp32 matmuls on bf16 instructions of
// this CPU (e.g. "brg:avx512_core_amx"); empty where it has none.
std::string dnnl_bf16_matmul();
}  // namespace bottle
