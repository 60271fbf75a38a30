#pragma once
// Linear layer grouping (BOOST §4.3): the bottleneck projections that read one input
// (A_q, A_k, A_v; A_gate, A_up) run their A's as one GEMM: their latents are interleaved
// columns of one [N, Σr] buffer (LatentLayout::interleaved) and their A's one [Σr, d_in]
// matrix, so x's gradient is one GEMM with k = Σr. Their B's run as one batched GEMM where
// their shapes agree (GQA: q alone, k and v together). Where the latents are stacked (LaX)
// the A's are batched GEMMs, and x's gradient one GEMM per member adding into it. With
// grouping off each projection runs alone. The results are the same either way up to
// rounding: one GEMM over k = Σr rounds its sum once.
#include <span>
#include <vector>

#include "backend/backend.h"
#include "nn/projection.h"

namespace bottle {

using ProjectionSpan = std::span<Projection* const>;

// The members' `field` tensors (z, u, du, dz) as one tensor where they are one buffer: [Σ N·r]
// where they lie one after another (stacked slabs, or a single projection), [N, Σr] where they
// are its interleaved columns; else empty.
Tensor flat(ProjectionSpan group, Tensor Projection::*field);
// The same as whole rows, for row-wise work (the online RMSNorm's scaling and statistics): the
// one [N, Σr] buffer where the latents are interleaved, else each member's [N, r_p].
std::vector<Tensor> rows_of(ProjectionSpan group, Tensor Projection::*field);

// The latent stage of each member (Projection::latent_forward, given its u_prev): one σ over
// the group's z and u slabs where every member is CoLA without a crossing and they lie one
// after another (allocate_grouped_activations), else member by member. The same values
// either way: σ is elementwise.
void group_latent_forward(Backend& be, ProjectionSpan group, std::span<const Tensor> u_prevs);
// Its backward (Projection::latent_backward), one σ' over the slabs where the forward had one.
void group_latent_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> u_prevs,
                           std::span<const Tensor> du_prevs);

// With grouping, interleaved latents and the A's one [Σr, d_in] matrix in memory, the group's
// A's run as one GEMM each way: below, "Σ_p" and "each p" are then one product.
// z_p (z_shard_p when sharded) = x A_pᵀ.
void group_down_forward(Backend& be, ProjectionSpan group, Tensor x, bool grouping);
// y_p = u_p[:, held columns] B_pᵀ.
void group_up_forward(Backend& be, ProjectionSpan group, std::span<const Tensor> ys, bool grouping);
// du_p (du_shard_p when sharded; partials_p [N, shard_rank] when given: btp's partial sums
// under LaX) (+)= dy_p B_p (= unless accumulate); dB_p += dy_pᵀ u_p[:, held].
void group_up_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                       std::span<const Tensor> partials, bool accumulate, bool grouping);
// dx (+)= Σ_p dz_p[:, held columns] A_p (= when !accumulate_dx); dA_p += dz_p[:, held]ᵀ x.
// Zeroes each du_p that is shared (Projection::shares_du: its next use accumulates).
void group_down_backward(Backend& be, ProjectionSpan group, Tensor dx, Tensor x, bool accumulate_dx,
                         bool grouping);
// Each backward's two halves, the input gradient (du_p; dx) and the weight gradient (dB_p; dA_p
// and the zeroing of a shared du_p), for a tensor-parallel backward that starts the input
// gradient's collective between them (Megatron's order). The same GEMMs as the whole.
void group_up_input_grad(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                         std::span<const Tensor> partials, bool accumulate, bool grouping);
void group_up_weight_grad(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                          bool grouping);
void group_down_input_grad(Backend& be, ProjectionSpan group, Tensor dx, bool accumulate_dx,
                           bool grouping);
void group_down_weight_grad(Backend& be, ProjectionSpan group, Tensor x, bool grouping);

}  // namespace bottle
