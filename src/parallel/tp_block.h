#pragma once
// A decoder block under tensor parallelism, h = x + Attn(RMSNorm1(x)); out = h +
// MLP(RMSNorm2(h)), in one of the three modes of docs/design.md §4. Each mode's forward and
// backward, with every collective it issues and its per-block volume, lives in one file:
// tp_full.cpp, tp_vanilla.cpp, tp_btp.cpp. At t = 1 every mode is the serial block.
#include <array>

#include "core/arena.h"
#include "core/backend.h"
#include "nn/attention.h"
#include "nn/projection.h"
#include "nn/rmsnorm.h"
#include "parallel/online_rmsnorm.h"
#include "parallel/recompute.h"
#include "parallel/tensor_parallel.h"

namespace bottle {

// This rank's widths (N = b·s rows).
struct BlockDims {
  int64_t batch = 0, seq = 0;
  int64_t d = 0;            // the whole hidden width
  int64_t d_res = 0;        // residual stream held: d, or d/t under btp
  int64_t dq = 0, dkv = 0;  // q and k/v widths held (this rank's heads)
  int64_t dff = 0;          // MLP width held
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float rope_theta = 10000.0f;
  bool gate_act = true;
  int64_t rows() const { return batch * seq; }
};

struct TpBlock {
  BlockDims dims;
  RMSNorm norm1, norm2;            // full, vanilla: whole rows, replicated
  OnlineRMSNorm online1, online2;  // btp: this rank's columns
  std::array<Projection, kNumProjections> proj;
  Attention attention;

  Tensor qkv;       // [N·(dq + 2·dkv)] q, k, v side by side: one all-reduce (vanilla)
  Tensor q, k, v;   // [N, dq], [N, dkv] x2, views into qkv (q, k rotated in place)
  Tensor h;         // [N, d_res] residual after attention
  Tensor gate_up;   // [2·N·dff]
  Tensor gate, up;  // [N, dff] views into gate_up
  Tensor gated;     // [N, dff] act(gate) ⊙ up
  ProjectionSlabs qkv_latent, gate_up_latent;  // grouped A outputs (btp: + RMSNorm S_i)
  Tensor gather;  // [2·N·r] vanilla LaX: all-gather scratch of the latent

  Projection& operator[](ProjectionId p) { return proj[int(p)]; }
  const Projection& operator[](ProjectionId p) const { return proj[int(p)]; }
  bool bottleneck() const { return proj[0].bottleneck(); }
};

// Activation gradients shared by all blocks (backward visits one block at a time).
struct BlockGradients {
  Tensor residual;     // [N, d_res] ∂loss/∂(residual stream at the current depth)
  Tensor normed;       // [N, d_res] ∂/∂(RMSNorm output)
  Tensor normed_part;  // [N, d_res] one projection's share before its own all-reduce
  Tensor attn;         // [N, dq]
  Tensor qkv;          // [N·(dq + 2·dkv)]
  Tensor q, k, v;      // views into qkv
  Tensor gate_up;      // [2·N·dff]
  Tensor gate, up;     // views
  Tensor gated;        // [N, dff]
  Tensor gather;       // [2·N·r] vanilla LaX: all-gather scratch
  Tensor latent_part;  // [N·Σr] btp: B's partial latent gradients before their all-reduce
};

// Where a block's buffers come from.
struct BlockAllocators {
  Allocator& kept;        // what the recompute policy keeps from forward to backward
  Allocator& recomputed;  // what it rebuilds in backward (policy none: `kept` again)
  Allocator& grads;       // gradients live only within one block's backward
  Allocator& comm;        // communication scratch
};

// Buffers of one block for this rank's dims, those `policy` keeps from a.kept.
void allocate_block(const BlockAllocators& a, const TensorParallel& tp, Recompute policy,
                    TpBlock& block);
// The gradients all blocks share (from a.grads; communication scratch from a.comm).
void allocate_block_gradients(const BlockAllocators& a, const TensorParallel& tp,
                              const TpBlock& block, BlockGradients& g);
// Fails, naming training.recompute, when `policy` does not apply to this mode and model.
void validate_recompute(Recompute policy, TpMode mode, bool bottleneck);

// prev: the block before (LaX crossing), else null. out = the block's output [N, d_res].
void block_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev, Tensor x,
                   Tensor out);
// On entry g.residual = ∂loss/∂out; on exit ∂loss/∂x. Parameter gradients +=.
void block_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev, Tensor x,
                    BlockGradients& g);

// Rebuilds what backward reads that `policy` did not keep (recompute.h). `out` [N, d_res]
// takes the block's output again where the policy re-runs the whole block. Collectives
// issued count under kRecomputePhase.
void block_recompute(Backend& be, const TensorParallel& tp, Recompute policy, TpBlock& b,
                     const TpBlock* prev, Tensor x, Tensor out);

// The per-mode implementations.
void full_block_forward(Backend&, const TensorParallel&, TpBlock&, Tensor x, Tensor out);
void full_block_backward(Backend&, const TensorParallel&, TpBlock&, Tensor x, BlockGradients&);
void vanilla_block_forward(Backend&, const TensorParallel&, TpBlock&, const TpBlock* prev, Tensor x,
                           Tensor out);
void vanilla_block_backward(Backend&, const TensorParallel&, TpBlock&, TpBlock* prev, Tensor x,
                            BlockGradients&);
void btp_block_forward(Backend&, const TensorParallel&, TpBlock&, const TpBlock* prev, Tensor x,
                       Tensor out);
void btp_block_backward(Backend&, const TensorParallel&, TpBlock&, TpBlock* prev, Tensor x,
                        BlockGradients&);
// lowrank: each chunk's inside from the kept latents, h and x; no collective.
void btp_block_recompute_lowrank(Backend&, const TensorParallel&, TpBlock&, const TpBlock* prev,
                                 Tensor x);

// Shared pieces.
Tensor prev_latent(const TpBlock* prev, const TpBlock& b, ProjectionId p);
Tensor prev_latent_grad(TpBlock* prev, const TpBlock& b, ProjectionId p);
Tensor attention_output(const TpBlock& b);  // [N, dq] view of the attention's output

}  // namespace bottle
