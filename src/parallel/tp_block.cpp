#include "parallel/tp_block.h"

#include <algorithm>

namespace bottle {
namespace {

Tensor slab_view(Tensor slab, int64_t offset, Shape shape) { return slab.view(offset, shape); }

int64_t widest_sharded_rank(const TpBlock& b) {
  int64_t widest = 0;
  for (const Projection& p : b.proj)
    if (p.sharded()) widest = std::max(widest, p.rank);
  return widest;
}

}  // namespace

void allocate_block(const BlockAllocators& a, const TensorParallel& tp, Recompute policy,
                    TpBlock& b) {
  const BlockDims& d = b.dims;
  const int64_t n = d.rows();
  using P = ProjectionId;
  const bool lax = b[P::q].kind == BottleneckKind::lax;
  // lowrank keeps the latents and the residual after attention; LaX's latents and their
  // gradients cross into the next block, so every policy keeps them.
  Allocator& latents = policy == Recompute::block ? a.recomputed : a.kept;
  const ProjectionAllocators from{latents, lax ? a.kept : a.recomputed, a.recomputed,
                                  lax ? a.kept : a.grads, a.grads};
  Allocator& rest = a.recomputed;
  if (tp.mode == TpMode::btp) {
    for (OnlineRMSNorm* norm : {&b.online1, &b.online2}) {
      norm->d = d.d;
      norm->allocate_activations(rest, n, d.d_res);
    }
  } else {
    b.norm1.allocate_activations(rest, n, d.d);
    b.norm2.allocate_activations(rest, n, d.d);
  }
  if (b.bottleneck()) {
    // btp sends each RMSNorm's statistic (N values) in the grouped A's all-reduce.
    const int64_t tail = tp.mode == TpMode::btp ? n : 0;
    const std::array<Projection*, 3> qkv{&b[P::q], &b[P::k], &b[P::v]};
    const std::array<Projection*, 2> gate_up{&b[P::gate], &b[P::up]};
    b.qkv_latent = allocate_grouped_activations(from, n, qkv, tail);
    b.gate_up_latent = allocate_grouped_activations(from, n, gate_up, tail);
    b[P::o].allocate_activations(from, n);
    b[P::down].allocate_activations(from, n);
  }
  Attention& att = b.attention;
  att.batch = d.batch;
  att.seq = d.seq;
  att.heads = d.heads;
  att.kv_heads = d.kv_heads;
  att.head_dim = d.head_dim;
  att.rope_theta = d.rope_theta;
  att.allocate_activations(rest);
  b.qkv = rest.alloc({n * (d.dq + 2 * d.dkv)});
  b.q = slab_view(b.qkv, 0, {n, d.dq});
  b.k = slab_view(b.qkv, n * d.dq, {n, d.dkv});
  b.v = slab_view(b.qkv, n * (d.dq + d.dkv), {n, d.dkv});
  b.h = (policy == Recompute::lowrank ? a.kept : rest).alloc({n, d.d_res});
  b.gate_up = rest.alloc({2 * n * d.dff});
  b.gate = slab_view(b.gate_up, 0, {n, d.dff});
  b.up = slab_view(b.gate_up, n * d.dff, {n, d.dff});
  b.gated = rest.alloc({n, d.dff});
  if (const int64_t widest = widest_sharded_rank(b)) b.gather = a.comm.alloc({2 * n * widest});
}

void allocate_block_gradients(const BlockAllocators& a, const TensorParallel& tp, const TpBlock& b,
                              BlockGradients& g) {
  const BlockDims& d = b.dims;
  const int64_t n = d.rows();
  Allocator& grads = a.grads;
  g.residual = grads.alloc({n, d.d_res});
  g.normed = grads.alloc({n, d.d_res});
  g.normed_part = grads.alloc({n, d.d_res});
  g.attn = grads.alloc({n, d.dq});
  g.qkv = grads.alloc({n * (d.dq + 2 * d.dkv)});
  g.q = slab_view(g.qkv, 0, {n, d.dq});
  g.k = slab_view(g.qkv, n * d.dq, {n, d.dkv});
  g.v = slab_view(g.qkv, n * (d.dq + d.dkv), {n, d.dkv});
  g.gate_up = grads.alloc({2 * n * d.dff});
  g.gate = slab_view(g.gate_up, 0, {n, d.dff});
  g.up = slab_view(g.gate_up, n * d.dff, {n, d.dff});
  g.gated = grads.alloc({n, d.dff});
  if (const int64_t widest = widest_sharded_rank(b)) g.gather = a.comm.alloc({2 * n * widest});
  if (tp.mode == TpMode::btp && b.bottleneck()) {
    int64_t widest_group = 0;
    for (const auto& slabs : {b.qkv_latent, b.gate_up_latent})
      widest_group = std::max(widest_group, slabs.du.numel());
    for (const Projection& p : b.proj) widest_group = std::max(widest_group, p.du.numel());
    g.latent_part = a.comm.alloc({widest_group});
  }
}

void validate_recompute(Recompute policy, TpMode mode, bool bottleneck) {
  if (policy != Recompute::lowrank) return;
  BOTTLE_CHECK(bottleneck,
               "training.recompute = \"lowrank\" keeps the r-wide latents of a bottleneck model, "
               "but model.bottleneck is \"none\"; use \"block\"");
  BOTTLE_CHECK(mode == TpMode::btp,
               "training.recompute = \"lowrank\" needs parallel.tp_mode = \"btp\" (the default "
               "for a bottleneck model, on one rank too): under \"{}\" the chunk boundaries are "
               "full-width and rebuilding them re-runs all-reduces; use \"block\"",
               tp_mode_name(mode));
}

void block_recompute(Backend& be, const TensorParallel& tp, Recompute policy, TpBlock& b,
                     const TpBlock* prev, Tensor x, Tensor out) {
  if (policy == Recompute::none) return;
  const CommPhase phase(tp.comm, kRecomputePhase);
  switch (policy) {
    case Recompute::none:
      return;
    case Recompute::block:
      return block_forward(be, tp, b, prev, x, out);
    case Recompute::lowrank:
      return btp_block_recompute_lowrank(be, tp, b, prev, x);
  }
}

Tensor prev_latent(const TpBlock* prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? (*prev)[p].u : Tensor{};
}

Tensor prev_latent_grad(TpBlock* prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? (*prev)[p].du : Tensor{};
}

Tensor attention_output(const TpBlock& b) { return b.attention.out.reshaped(b.q.shape); }

void block_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev, Tensor x,
                   Tensor out) {
  switch (tp.mode) {
    case TpMode::full:
      return full_block_forward(be, tp, b, x, out);
    case TpMode::vanilla:
      return vanilla_block_forward(be, tp, b, prev, x, out);
    case TpMode::btp:
      return btp_block_forward(be, tp, b, prev, x, out);
  }
}

void block_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev, Tensor x,
                    BlockGradients& g) {
  switch (tp.mode) {
    case TpMode::full:
      return full_block_backward(be, tp, b, x, g);
    case TpMode::vanilla:
      return vanilla_block_backward(be, tp, b, prev, x, g);
    case TpMode::btp:
      return btp_block_backward(be, tp, b, prev, x, g);
  }
}

}  // namespace bottle
