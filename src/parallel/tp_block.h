#pragma once
// A decoder block under tensor parallelism, h = x + Attn(RMSNorm1(x)); out = h +
// MLP(RMSNorm2(h)), as one TP mode runs it on one rank. The layout (tp_layout.h) describes the
// mode and makes its blocks; a block is made bound to its parameters and with its buffers
// allocated, and owns its forward, backward and recomputation. TpBlock holds the buffers and
// widths every mode's block has; each mode's block (tp_full.cpp, tp_vanilla.cpp, tp_btp.cpp)
// derives from it with what only it needs (its norms, its communication scratch). At t = 1
// every mode is the serial block.
#include <array>
#include <memory>

#include "backend/backend.h"
#include "core/arena.h"
#include "nn/attention.h"
#include "nn/model_shape.h"
#include "nn/param.h"
#include "nn/projection.h"
#include "nn/rmsnorm.h"
#include "parallel/recompute.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_overlap.h"

namespace bottle {

class TpLayout;

// This rank's widths (N = b·s rows).
struct BlockDims {
  int64_t batch = 0, seq = 0;
  int64_t d = 0;            // the whole hidden width
  int64_t d_res = 0;        // residual stream held: d, or d/t where the layout shards it
  int64_t dq = 0, dkv = 0;  // q and k/v widths held (this rank's heads)
  int64_t dff = 0;          // MLP width held
  int64_t heads = 0, kv_heads = 0, head_dim = 0;
  float rope_theta{};  // model.rope_theta
  bool gate_act{};     // act = SiLU in the MLP (ModelConfig::gate_act)
  int64_t rows() const { return batch * seq; }
};

// One block's parameters by role, as this rank holds them. The model names them (they are its
// checkpoint's tensors); the block reads them through these handles.
struct ProjectionParams {
  Param weight;         // full-rank W
  Param A, B;           // bottleneck factors
  Param G, ln_w, ln_b;  // LaX's crossing and LN_r, in every block but the first
};
struct BlockParams {
  Param norm1_weight, norm2_weight;  // the RMSNorms' γ (this rank's part of [d])
  std::array<ProjectionParams, kNumProjections> proj;
};

// What a layout needs to make one block of one rank.
struct BlockSpec {
  ModelShape model;
  int t = 1, tp_rank = 0;  // the TP degree and this rank
  bool crossing = false;   // LaX in every block but the model's first
  bool grouping = true;    // parallel.grouping: the block lays its grouped latents out for it
  float norm_eps{}, rope_theta{};
  bool gate_act{};
  int64_t batch = 0, seq = 0;  // of a micro-batch
  Recompute policy = Recompute::none;
  // The weight gradients may be deferred to a W pass (TensorParallel::weight_grads): the block
  // keeps what they read past its backward (its gradient buffers come from a kept allocator,
  // and d_out_kept holds the residual's gradient they read).
  bool keeps_weight_grad_inputs = false;
  BlockParams params;
};

// Where a block's buffers come from.
struct BlockAllocators {
  Allocator& kept;        // what the recompute policy keeps from forward to backward
  Allocator& recomputed;  // what it rebuilds in backward (policy none: `kept` again)
  Allocator& grads;       // gradients live only within one block's backward
  Allocator& comm;        // communication scratch
};

// The latents of a block that the next block's LaX crossing reads (u) and adds its share of
// their gradient into (du), one per projection; empty tensors where there are none.
struct BlockLatents {
  std::array<Tensor, kNumProjections> u, du;  // [N, r] each
};

// Activation gradients within one block's backward (from BlockAllocators::grads, which blocks
// share: backward visits one block at a time; each its own where the weight gradients are
// deferred).
struct BlockGradients {
  Tensor normed;    // [N, d_res] ∂/∂(RMSNorm output); forward's scratch in full and vanilla
                    // (the o projection's output before the residual add)
  Tensor attn;      // [N, dq]
  Tensor qkv;       // [N·(dq + 2·dkv)]
  Tensor q, k, v;   // views into qkv
  Tensor gate_up;   // [2·N·dff]
  Tensor gate, up;  // views
  Tensor gated;     // [N, dff]
};

class TpBlock {
 public:
  TpBlock(const TpBlock&) = delete;
  TpBlock& operator=(const TpBlock&) = delete;
  virtual ~TpBlock() = default;

  // The passes are coroutines (tp_overlap.h) that co_await their collectives. Run serially
  // (tp.half null) a pass has ended when it returns: .get() rethrows its error. Arguments are
  // taken by value where the pass may outlive the caller's expression (TP overlap's halves);
  // the backend and the TP group outlive every pass.
  //
  // out [N, d_res] = the block of x [N, d_res]. prev: the latents of the block before (LaX's
  // crossing reads them).
  virtual TpTask forward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                         Tensor out) = 0;
  // d_residual: on entry ∂loss/∂out, on exit ∂loss/∂x [N, d_res]. Parameter gradients +=, and
  // prev.du += the crossing's share.
  virtual TpTask backward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                          Tensor d_residual) = 0;
  // Rebuilds what backward reads that the block's policy did not keep (recompute.h). `out`
  // [N, d_res] takes the block's output again where the policy re-runs the whole block.
  // Collectives issued count under kRecomputePhase. Here: none and block; a mode adds its own.
  virtual TpTask recompute(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                           Tensor out);

  BlockLatents latents() const;
  Recompute policy() const { return policy_; }

  // The state every mode's block has; the modes' passes read and write it.
  BlockDims dims;
  Param norm1_weight, norm2_weight;
  float norm_eps{};
  std::array<Projection, kNumProjections> proj;
  Attention attention;

  Tensor qkv;       // [N·(dq + 2·dkv)] q, k, v side by side: one all-reduce (vanilla)
  Tensor q, k, v;   // [N, dq], [N, dkv] x2, views into qkv (q, k rotated in place)
  Tensor h;         // [N, d_res] residual after attention
  Tensor gate_up;   // [2·N·dff]
  Tensor gate, up;  // [N, dff] views into gate_up
  Tensor gated;     // [N, dff] act(gate) ⊙ up
  ProjectionSlabs qkv_latent, gate_up_latent;  // grouped A outputs (+ a layout's tail)
  BlockGradients grad;
  // [N, d_res] each: the residual's gradient as the o (0) and down (1) projections read it, for
  // their deferred weight gradients (BlockSpec::keeps_weight_grad_inputs); else empty.
  std::array<Tensor, 2> d_out_kept;
  static constexpr int kAttnOut = 0, kMlpOut = 1;

  // The dy the o (kAttnOut) or down (kMlpOut) projection reads: d_residual itself, or where its
  // weight gradient is queued (tp.weight_grads) a copy kept until the W pass, as the residual's
  // gradient changes on.
  Tensor output_grad(Backend& be, const TensorParallel& tp, Tensor d_residual, int which);

  Projection& operator[](ProjectionId p) { return proj[int(p)]; }
  const Projection& operator[](ProjectionId p) const { return proj[int(p)]; }
  bool bottleneck() const { return proj[0].bottleneck(); }

 protected:
  // Bound to spec.params with the layout's widths; nothing allocated yet.
  TpBlock(const TpLayout& layout, const BlockSpec& spec);
  // The buffers every mode's block has, those the policy keeps from a.kept, and the block's
  // gradients. The grouped A outputs get `slab_tail` more elements (btp's RMSNorm statistics).
  void allocate_buffers(const BlockAllocators& a, int64_t slab_tail);

 private:
  Recompute policy_;
  bool grouping_;
  bool keeps_weight_grad_inputs_;
};

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

// Shared pieces of the modes' forward and backward: the previous latent of projection p and
// its gradient where b's projection crosses, else empty.
Tensor prev_latent(const BlockLatents& prev, const TpBlock& b, ProjectionId p);
Tensor prev_latent_grad(const BlockLatents& prev, const TpBlock& b, ProjectionId p);
Tensor attention_output(const TpBlock& b);  // [N, dq] view of the attention's output
// The widest latent of the block's projections that hold only some latent columns; 0: none.
int64_t widest_sharded_rank(const TpBlock& b);

}  // namespace bottle
