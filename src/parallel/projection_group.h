#pragma once
// Linear layer grouping (BOOST §4.3): the bottleneck projections that read one input
// (A_q, A_k, A_v; A_gate, A_up) run as one batched GEMM with the input broadcast, and
// their B's as one batched GEMM where their shapes agree (GQA: q alone, k and v
// together). With grouping off, or shapes that differ, each projection runs alone; the
// results are the same either way.
#include <span>

#include "core/backend.h"
#include "nn/projection.h"

namespace bottle {

using ProjectionSpan = std::span<Projection* const>;

// The members' `field` tensors (z, u, du, dz) as one flat tensor where they lie one after
// another (grouped activations, or a single projection), else empty.
Tensor flat(ProjectionSpan group, Tensor Projection::*field);

// The latent stage of each member (Projection::latent_forward, given its u_prev): one σ over
// the group's z and u slabs where every member is CoLA without a crossing and they lie one
// after another (allocate_grouped_activations), else member by member. The same values
// either way: σ is elementwise.
void group_latent_forward(Backend& be, ProjectionSpan group, std::span<const Tensor> u_prevs);
// Its backward (Projection::latent_backward), one σ' over the slabs where the forward had one.
void group_latent_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> u_prevs,
                           std::span<const Tensor> du_prevs);

// z_p (z_shard_p when sharded) = x A_pᵀ.
void group_down_forward(Backend& be, ProjectionSpan group, Tensor x, bool grouping);
// y_p = u_p[:, held columns] B_pᵀ.
void group_up_forward(Backend& be, ProjectionSpan group, std::span<const Tensor> ys, bool grouping);
// du_out_p (+)= dy_p B_p ([N, shard_rank]; = unless accumulate); dB_p += dy_pᵀ u_p[:, held].
void group_up_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                       std::span<const Tensor> du_out, bool accumulate, bool grouping);
// dx (+)= Σ_p dz_p[:, held columns] A_p (= when !accumulate_dx); dA_p += dz_p[:, held]ᵀ x.
// Zeroes each du_p that is shared (Projection::shares_du: its next use accumulates).
void group_down_backward(Backend& be, ProjectionSpan group, Tensor dx, Tensor x, bool accumulate_dx,
                         bool grouping);

}  // namespace bottle
