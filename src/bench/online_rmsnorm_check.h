#pragma once
// The online RMSNorm (online_rmsnorm.h) in front of a row-split linear layer on the ranks
// of a TP group, against RMSNorm + the whole linear layer on one rank, in fp32: BOOST §4.2
// reports max 7e-7 and mean 6e-8 absolute difference of the layer output on 4 GPUs. The
// test of the online norm and `bottle bench norm` both measure it here.
#include <cstdint>

#include "backend/backend.h"
#include "parallel/tensor_parallel.h"

namespace bottle {

struct OnlineNormProblem {
  int64_t rows = 64, hidden = 512, rank = 128;  // x [rows, hidden], A [rank, hidden]
  float weight_std = 0.02f;                     // A ~ N(0, weight_std²)
  float gamma_spread = 0.1f;                    // γ = 1 + gamma_spread · N(0, 1)
  uint32_t seed = 3;                            // x and ∂z ~ N(0, 1)
  float eps = 1e-5f;                            // RMSNorm's ε (LLaMA's)
};

struct AbsDiff {
  double max = 0, mean = 0;
};

struct OnlineNormDiffs {
  AbsDiff output;       // z = RMSNorm(x) Aᵀ
  AbsDiff input_grad;   // ∂/∂x from a random ∂z
  AbsDiff weight_grad;  // ∂/∂γ
};

// Collective over tp.comm (null: one rank against itself): every rank calls it and gets
// the same differences. The one-rank reference runs on rank 0 only, so that large shapes
// stay affordable; tp.norm_backward picks how the backward statistic is obtained.
OnlineNormDiffs compare_online_rmsnorm(Backend& be, const TensorParallel& tp,
                                       const OnlineNormProblem& problem);

}  // namespace bottle
