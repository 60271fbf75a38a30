#pragma once
// One projection of a block (q, k, v, o, gate, up, down): either a full-rank linear map or a
// bottleneck pair A: d_in → r, B: r → d_out with something between the factors (docs/design.md §3):
//   svd:  y = B (A x)
//   cola: y = B σ(A x)
//   lax:  z = A x; zc = z + G u_prev in every block but the first; u = σ(LN_r(zc)); y = B u;
//         u is passed to the same projection of the next block (the latent crossing).
// The work is split into the three stages that tensor parallelism cuts between:
// down (A), latent (crossing, LN_r, σ; runs on the whole r-wide latent) and up (B).
//
// A rank may hold only latent columns [shard_offset, shard_offset + shard_rank) of A and B
// (vanilla TP of a LaX model, whose crossing needs the whole latent): A then writes z_shard,
// the caller gathers it into z, and B reads its columns of u.
#include <array>
#include <span>
#include <string>

#include "core/arena.h"
#include "backend/backend.h"
#include "nn/param.h"

namespace bottle {

enum class BottleneckKind { none, svd, cola, lax };
inline constexpr std::array<const char*, 4> kBottleneckKindNames = {"none", "svd", "cola", "lax"};
const char* bottleneck_kind_name(BottleneckKind kind);

// The seven projections of a block, in the order grouping wants them side by side.
enum class ProjectionId { q, k, v, o, gate, up, down };
inline constexpr int kNumProjections = 7;
inline constexpr std::array<const char*, kNumProjections> kProjectionNames = {
    "q", "k", "v", "o", "gate", "up", "down"};
BottleneckKind parse_bottleneck_kind(const std::string& name);  // throws naming the value

// Where a projection's buffers come from. They may all be one arena; activation
// recomputation keeps some per block and shares the rest (parallel/recompute.h).
struct ProjectionAllocators {
  Allocator& z;       // z: A's output (under btp, the latent after its all-reduce)
  Allocator& u;       // u: the latent B reads (svd: z itself)
  Allocator& inside;  // zc, zn, LN_r statistics, z_shard: rebuilt from z and u_prev
  Allocator& du;      // du: outlives this block's backward under LaX (the crossing)
  Allocator& grads;   // dz, dzn, du_shard: live only within this projection's backward
};

struct Projection {
  BottleneckKind kind = BottleneckKind::none;
  int64_t d_in = 0, d_out = 0;               // this rank's widths
  int64_t rank = 0;                          // width of the latent the latent stage runs on
  int64_t shard_rank = 0, shard_offset = 0;  // latent columns held by A and B (0: all)
  bool crossing = false;                     // lax in every block but the first
  float ln_eps = 1e-6f;
  // The group's Σr where z, u, du and dz are its interleaved columns (LatentLayout::
  // interleaved), their row stride; 0 where they are [N, rank] of their own.
  int64_t ld = 0;

  Param weight;  // [d_out, d_in], full-rank only
  Param A;       // [shard_rank, d_in]
  Param B;       // [d_out, shard_rank]
  Param G;       // [rank, rank], lax crossing
  Param ln_w;    // [rank]
  Param ln_b;    // [rank]

  // Activations of one micro-batch of N rows (z, u, du, dz: row stride latent_stride()).
  Tensor z;         // [N, rank] A x
  Tensor zc;        // [N, rank] z + u_prev Gᵀ when crossing
  Tensor zn;        // [N, rank] LN_r(zc) when crossing
  Tensor ln_mean;   // [N]
  Tensor ln_rstd;   // [N]
  Tensor u;         // [N, rank] σ(z or zn); the latent B reads (svd: z itself)
  Tensor z_shard;   // [N, shard_rank] A's output when sharded, gathered into z
  Tensor du_shard;  // [N, shard_rank] B's input gradient when sharded, gathered into du
  // Gradients of the latent. Under LaX du persists through the backward of the next block,
  // which adds the crossing's share into it before this projection's backward runs, so B's
  // backward adds into it and it is zeroed after use; otherwise B's backward is its only
  // producer and writes it (shares_du()).
  Tensor du;   // [N, rank]
  Tensor dz;   // [N, rank] (svd: du itself)
  Tensor dzn;  // [N, rank] ∂/∂zn when crossing

  bool bottleneck() const { return kind != BottleneckKind::none; }
  bool sharded() const { return shard_rank != 0 && shard_rank != rank; }
  bool shares_du() const { return kind == BottleneckKind::lax; }
  // Whether z, u, du and dz are columns of a group's [N, Σr] buffers: only the group's
  // functions (parallel/projection_group.h) run such a projection's stages.
  bool interleaved() const { return ld != 0; }
  int64_t latent_stride() const { return ld ? ld : rank; }  // of z, u, du, dz
  void allocate_activations(const ProjectionAllocators& from, int64_t rows);

  // y[N, d_out] = P(x[N, d_in]) (+ residual[N, d_out], added in the last GEMM's epilogue).
  // u_prev: the previous block's u of the same projection (lax with crossing), else empty.
  // Not for sharded projections.
  void forward(Backend& be, Tensor y, Tensor x, Tensor u_prev, Tensor residual = {});
  // dx += ∂/∂x (dx = when !accumulate_dx), parameter grads +=, du_prev += ∂/∂u_prev
  // (crossing). Zeroes du when done where it is shared (shares_du()).
  void backward(Backend& be, Tensor dx, Tensor dy, Tensor x, Tensor u_prev, Tensor du_prev,
                bool accumulate_dx = true);

  // The stages (forward() = down, latent, up).
  void down_forward(Backend& be, Tensor x);  // z (z_shard when sharded) = x Aᵀ
  void latent_forward(Backend& be, Tensor u_prev);
  void up_forward(Backend& be, Tensor y, Tensor residual = {});  // y = u Bᵀ (+ residual)
  // du (du_shard when sharded) = dy B, += where du is shared; dB += dyᵀ u.
  void up_backward(Backend& be, Tensor dy);
  void latent_backward(Backend& be, Tensor u_prev, Tensor du_prev);
  void down_backward(Backend& be, Tensor dx, Tensor x, bool accumulate_dx = true);
};

// How a group's latents share their slabs.
enum class LatentLayout {
  // Member after member, each [N, r_p]: what work done member by member needs (grouping off:
  // an all-reduce each; LaX: the crossing and LN_r run on each member's own rows).
  stacked,
  // One [N, Σr] buffer, member p in columns [o_p, o_p + r_p) (row stride Σr): the group's A's
  // are then one GEMM each way, the input gradient one GEMM with k = Σr instead of a GEMM per
  // member adding into dx, and the σ and row statistics run once on the whole buffer.
  interleaved,
};

// Activations of projections that read one input (q, k, v; gate, up) so that grouped work
// sees contiguous memory: z, u, du and dz each come from one slab holding the members in
// `layout`. The z slab has `z_tail` more elements after them (btp sends its RMSNorm
// statistics in the same all-reduce).
struct ProjectionSlabs {
  Tensor z;   // [Σ N·rank + z_tail]
  Tensor du;  // [Σ N·rank]
};
ProjectionSlabs allocate_grouped_activations(const ProjectionAllocators& from, int64_t rows,
                                             std::span<Projection* const> group,
                                             LatentLayout layout, int64_t z_tail = 0);

}  // namespace bottle
