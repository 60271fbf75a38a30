#pragma once
// From dense to low rank: every projection W [d_out, d_in] of a full-rank model replaced by a
// truncated SVD, W ≈ U_r Σ_r V_rᵀ, as the bottleneck pair B = U_r √Σ_r [d_out, r] and
// A = √Σ_r V_rᵀ [r, d_in] (the square root splits the scale evenly between the factors).
// Embeddings, norms and the LM head are copied. For svd the result computes B·(A·x), the
// best rank-r approximation of W·x (Eckart–Young); cola puts σ between the factors, so it
// starts near the dense model only as far as σ is near the identity on A·x, and must train on.
#include <memory>
#include <string>
#include <vector>

#include "model/llama.h"

namespace bottle {

struct FactorReport {
  std::string name;  // the dense tensor, e.g. model.layers.0.self_attn.q_proj.weight
  int64_t d_out = 0, d_in = 0, rank = 0;
  // ‖W − B·A‖_F / ‖W‖_F = sqrt(Σ_{i>r} s_i²) / sqrt(Σ s_i²), from the singular values.
  double relative_error = 0.0;
};

// The low-rank twin of `dense`: bottleneck `kind` (svd or cola) at `rank` in every projection,
// with the dense model's MLP gate activation kept. Refuses a kind other than svd / cola, a
// dense model that is not full-rank, and a rank above min(d_in, d_out) of a projection
// (naming it).
ModelConfig lowrank_config(const ModelConfig& dense, BottleneckKind kind, int64_t rank);

// Factorises every projection of the one-process model `dense` into a new model of
// lowrank_config(...) on the same backend; `reports` gets one entry per projection, in order.
std::unique_ptr<LlamaModel> factorize_model(const LlamaModel& dense, BottleneckKind kind,
                                            int64_t rank, std::vector<FactorReport>& reports);

}  // namespace bottle
