#pragma once
// Online RMSNorm (BOOST §4.2, docs/design.md §5) for btp, where the residual stream is sharded and
// the norm sits inside a chunk, fused with the row-parallel A's that read its output.
//
// Forward, rank i with x_i = its d/t columns:
//   S_i = Σ x_i²,  rms_i = sqrt(S_i / (d/t) + eps),  n_i = x_i ⊙ γ_i / rms_i  (well scaled
//   for the GEMM in low precision),  H_i = (n_i A_iᵀ) · rms_i = (x_i ⊙ γ_i) A_iᵀ.
//   One all-reduce of [H_i | S_i] (k·r + 1 per token) gives ΣH and ΣS; then
//   rms = sqrt(ΣS / d + eps) and z = ΣH / rms = RMSNorm(x) Aᵀ exactly.
// Backward: dn_i = dz A_i is local; the RMSNorm backward also needs, per token,
//   c = Σ over the whole hidden of γ ⊙ dn ⊙ x.
// Because dn = dz A and z = (x ⊙ γ) Aᵀ / rms:
//   c = Σ_j γ_j x_j Σ_k dz_k A_kj = Σ_k dz_k ((x ⊙ γ) Aᵀ)_k = rms · <dz, z>,
// and z and dz are whole (replicated) on every rank after the chunk's own backward
// all-reduce: so `from_latent` needs no communication at all (folded into that collective),
// while `all_reduce` sums the local c_i = <dn_i, n_i> · rms over ranks (b·s elements).
#include <span>
#include <string_view>
#include <utility>

#include "backend/backend.h"
#include "core/arena.h"
#include "nn/param.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_overlap.h"

namespace bottle {

struct OnlineRMSNorm {
  Param weight;   // γ_i [d/t]
  float eps{};    // model.rms_norm_eps: whoever binds the weight sets it
  int64_t d = 0;  // the whole hidden width
  // The TP group has one rank: x is the whole row and the norm is the plain RMSNorm, one
  // kernel each way (rmsnorm_forward, rmsnorm_backward, which takes c from the row itself).
  // The partials need no rescaling (the factor rms_i / rms is 1) and `out` is already exact,
  // so scale_partials, finish and latent_statistic do nothing, ΣS is neither written nor
  // read, and z = RMSNorm(x) Aᵀ is rounded once.
  bool one_rank = false;
  Tensor out;        // [N, d/t] x ⊙ γ / rms_i for the GEMM; after finish() x ⊙ γ / rms
  Tensor rms_local;  // [N]
  Tensor rstd;       // [N] 1 / rms of the whole row
  Tensor factor;     // [N] scratch
  Tensor dot;        // [N] the backward statistic c

  void allocate_activations(Allocator& arena, int64_t rows, int64_t cols);
  // out = x ⊙ γ / rms_i; sumsq (the all-reduce slab's tail, [N]) = S_i.
  void forward_local(Backend& be, Tensor x, Tensor sumsq);
  // Before the all-reduce: partial GEMM outputs *= rms_i.
  void scale_partials(Backend& be, std::span<const Tensor> partials, Tensor sumsq);
  // After it: rstd from ΣS; outputs /= rms; out rescaled to the exact normalised slice.
  void finish(Backend& be, std::span<const Tensor> outputs, Tensor sumsq_total);
  // out, rms_local, rstd and factor again, as forward left them, from x and the kept ΣS
  // (activation recomputation; the latents were kept already finished).
  void recompute(Backend& be, Tensor x, Tensor sumsq_total);
  // from_latent: the statistic c from (z, dz) of the A's reading this norm (whole and
  // replicated). Call before their backward zeroes the latent gradients.
  void latent_statistic(Backend& be, std::span<const std::pair<Tensor, Tensor>> latents);
  // dx += ∂/∂x and dγ += from dn = ∂/∂out [N, d/t]; all_reduce: c from dn, summed over ranks.
  // A coroutine of the block's pass (tp_overlap.h): the statistic's all-reduce is awaited.
  TpTask backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dn, Tensor x,
                  std::string_view site);

 private:
  void set_local_rms(Backend& be, Tensor sumsq);        // rms_local from S_i
  void set_whole_rms(Backend& be, Tensor sumsq_total);  // rstd, and factor = rms_local · rstd
};

}  // namespace bottle
