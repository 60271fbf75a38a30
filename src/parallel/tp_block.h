#pragma once
// A decoder block under tensor parallelism, h = x + Attn(RMSNorm1(x)); out = h +
// MLP(RMSNorm2(h)): the buffers and widths every TP mode's block has. Each mode's layout
// (tp_layout.h) derives its own block from TpBlock with what only it needs (its norms,
// its communication scratch) and runs its forward and backward; at t = 1 every mode is the
// serial block.
#include <array>
#include <memory>

#include "core/arena.h"
#include "core/backend.h"
#include "nn/attention.h"
#include "nn/model_shape.h"
#include "nn/param.h"
#include "nn/projection.h"
#include "nn/rmsnorm.h"
#include "parallel/recompute.h"

namespace bottle {

// This rank's widths (N = b·s rows).
struct BlockDims {
  int64_t batch = 0, seq = 0;
  int64_t d = 0;            // the whole hidden width
  int64_t d_res = 0;        // residual stream held: d, or d/t where the layout shards it
  int64_t dq = 0, dkv = 0;  // q and k/v widths held (this rank's heads)
  int64_t dff = 0;          // MLP width held
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float rope_theta{};  // model.rope_theta, set by the model (its one default is the model's)
  bool gate_act{};     // act = SiLU in the MLP, set by the model (ModelConfig::gate_act)
  int64_t rows() const { return batch * seq; }
};

struct TpBlock {
  BlockDims dims;
  // The RMSNorms' weights γ (this rank's part of [d]) and ε; the layout's block holds the norm
  // objects that use them.
  Param norm1_weight, norm2_weight;
  float norm_eps{};  // model.rms_norm_eps, set by the model
  std::array<Projection, kNumProjections> proj;
  Attention attention;

  Tensor qkv;       // [N·(dq + 2·dkv)] q, k, v side by side: one all-reduce (vanilla)
  Tensor q, k, v;   // [N, dq], [N, dkv] x2, views into qkv (q, k rotated in place)
  Tensor h;         // [N, d_res] residual after attention
  Tensor gate_up;   // [2·N·dff]
  Tensor gate, up;  // [N, dff] views into gate_up
  Tensor gated;     // [N, dff] act(gate) ⊙ up
  ProjectionSlabs qkv_latent, gate_up_latent;  // grouped A outputs (+ a layout's tail)

  TpBlock() = default;
  TpBlock(const TpBlock&) = default;
  TpBlock& operator=(const TpBlock&) = default;
  virtual ~TpBlock() = default;
  // A copy bound to the same parameters, to hold another micro-batch's activations.
  virtual std::unique_ptr<TpBlock> clone() const { return std::make_unique<TpBlock>(*this); }

  Projection& operator[](ProjectionId p) { return proj[int(p)]; }
  const Projection& operator[](ProjectionId p) const { return proj[int(p)]; }
  bool bottleneck() const { return proj[0].bottleneck(); }
};

// A layout's block type: TpBlock plus its own members, cloned as itself.
template <typename Block>
struct TpBlockOf : TpBlock {
  std::unique_ptr<TpBlock> clone() const override {
    return std::make_unique<Block>(static_cast<const Block&>(*this));
  }
};

// Activation gradients shared by all blocks (backward visits one block at a time). A layout
// that needs more derives from it (TpLayout::make_gradients).
struct BlockGradients {
  Tensor residual;  // [N, d_res] ∂loss/∂(residual stream at the current depth)
  Tensor normed;    // [N, d_res] ∂/∂(RMSNorm output)
  Tensor attn;      // [N, dq]
  Tensor qkv;       // [N·(dq + 2·dkv)]
  Tensor q, k, v;   // views into qkv
  Tensor gate_up;   // [2·N·dff]
  Tensor gate, up;  // views
  Tensor gated;     // [N, dff]

  BlockGradients() = default;
  BlockGradients(const BlockGradients&) = delete;
  BlockGradients& operator=(const BlockGradients&) = delete;
  virtual ~BlockGradients() = default;
};

// Where a block's buffers come from.
struct BlockAllocators {
  Allocator& kept;        // what the recompute policy keeps from forward to backward
  Allocator& recomputed;  // what it rebuilds in backward (policy none: `kept` again)
  Allocator& grads;       // gradients live only within one block's backward
  Allocator& comm;        // communication scratch
};

// The buffers every layout's block has, those `policy` keeps from a.kept. The grouped A
// outputs get `slab_tail` more elements (btp's RMSNorm statistics).
void allocate_block_buffers(const BlockAllocators& a, Recompute policy, int64_t slab_tail,
                            TpBlock& block);
// full and vanilla: the two whole-row RMSNorms (replicated on every rank), bound to the
// block's norm weights and allocated from a.recomputed.
void allocate_replicated_norms(const BlockAllocators& a, const TpBlock& block, RMSNorm& norm1,
                               RMSNorm& norm2);
// The widths of a rank that holds heads/t heads and d_ff/t of the MLP (full and btp), with a
// residual stream of d_res.
BlockDims head_split_dims(const ModelShape& m, int t, int64_t d_res);
// Throws SettingError naming the key unless t divides what such a rank splits: the
// vocabulary, d, d_ff and both head counts (kv heads are never replicated).
void check_head_split_divisible(const ModelShape& m, int t);
// The gradients every layout has (from a.grads).
void allocate_block_gradient_buffers(const BlockAllocators& a, const TpBlock& block,
                                     BlockGradients& g);

// Shared pieces of the modes' forward and backward.
Tensor prev_latent(const TpBlock* prev, const TpBlock& b, ProjectionId p);
Tensor prev_latent_grad(TpBlock* prev, const TpBlock& b, ProjectionId p);
Tensor attention_output(const TpBlock& b);  // [N, dq] view of the attention's output
// The widest latent of the block's projections that hold only some latent columns; 0: none.
int64_t widest_sharded_rank(const TpBlock& b);

}  // namespace bottle
