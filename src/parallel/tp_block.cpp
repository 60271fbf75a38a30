#include "parallel/tp_block.h"

#include <algorithm>

#include "parallel/tp_layout.h"

namespace bottle {

TpBlock::TpBlock(const TpLayout& layout, const BlockSpec& spec)
    : policy_(spec.policy),
      grouping_(spec.grouping),
      keeps_weight_grad_inputs_(spec.keeps_weight_grad_inputs) {
  const ModelShape& m = spec.model;
  dims = layout.block_dims(m, spec.t);
  dims.batch = spec.batch;
  dims.seq = spec.seq;
  dims.rope_theta = spec.rope_theta;
  dims.gate_act = spec.gate_act;
  norm1_weight = spec.params.norm1_weight;
  norm2_weight = spec.params.norm2_weight;
  norm_eps = spec.norm_eps;
  for (int i = 0; i < kNumProjections; ++i) {
    const auto id = ProjectionId(i);
    const ProjectionDims widths = layout.projection_dims(m, id, spec.t, spec.tp_rank);
    const ProjectionParams& params = spec.params.proj[size_t(i)];
    Projection& p = proj[size_t(i)];
    p.kind = m.bottleneck;
    p.d_in = widths.d_in;
    p.d_out = widths.d_out;
    if (!m.low_rank()) {
      p.weight = params.weight;
      continue;
    }
    p.A = params.A;
    p.B = params.B;
    p.crossing = spec.crossing;
    p.rank = widths.rank;
    p.shard_rank = widths.shard_rank;
    p.shard_offset = widths.shard_offset;
    if (p.crossing) {
      p.G = params.G;
      p.ln_w = params.ln_w;
      p.ln_b = params.ln_b;
    }
  }
  attention.batch = dims.batch;
  attention.seq = dims.seq;
  attention.heads = dims.heads;
  attention.kv_heads = dims.kv_heads;
  attention.head_dim = dims.head_dim;
  attention.rope_theta = dims.rope_theta;
}

void TpBlock::allocate_buffers(const BlockAllocators& a, int64_t slab_tail) {
  const BlockDims& d = dims;
  const int64_t n = d.rows();
  using P = ProjectionId;
  const bool lax = proj[int(P::q)].kind == BottleneckKind::lax;
  // lowrank keeps the latents and the residual after attention; LaX's latents and their
  // gradients cross into the next block, so every policy keeps them.
  Allocator& latents = policy_ == Recompute::block ? a.recomputed : a.kept;
  const ProjectionAllocators from{latents, lax ? a.kept : a.recomputed, a.recomputed,
                                  lax ? a.kept : a.grads, a.grads};
  Allocator& rest = a.recomputed;
  if (bottleneck()) {
    const std::array<Projection*, 3> qkv_group{&(*this)[P::q], &(*this)[P::k], &(*this)[P::v]};
    const std::array<Projection*, 2> gate_up_group{&(*this)[P::gate], &(*this)[P::up]};
    // Grouping runs a group's A's as one GEMM on interleaved latents. Without it each member
    // is reduced on its own, and under LaX each member's crossing and LN_r read its own rows:
    // both want them stacked.
    const LatentLayout layout =
        grouping_ && !lax ? LatentLayout::interleaved : LatentLayout::stacked;
    qkv_latent = allocate_grouped_activations(from, n, qkv_group, layout, slab_tail);
    gate_up_latent = allocate_grouped_activations(from, n, gate_up_group, layout, slab_tail);
    (*this)[P::o].allocate_activations(from, n);
    (*this)[P::down].allocate_activations(from, n);
  }
  attention.allocate_activations(rest);
  qkv = rest.alloc_act({n * (d.dq + 2 * d.dkv)});
  q = qkv.view(0, {n, d.dq});
  k = qkv.view(n * d.dq, {n, d.dkv});
  v = qkv.view(n * (d.dq + d.dkv), {n, d.dkv});
  h = (policy_ == Recompute::lowrank ? a.kept : rest).alloc_act({n, d.d_res});
  gate_up = rest.alloc_act({2 * n * d.dff});
  gate = gate_up.view(0, {n, d.dff});
  up = gate_up.view(n * d.dff, {n, d.dff});
  gated = rest.alloc_act({n, d.dff});

  BlockGradients& g = grad;
  g.normed = a.grads.alloc_act({n, d.d_res});
  g.attn = a.grads.alloc_act({n, d.dq});
  g.qkv = a.grads.alloc_act({n * (d.dq + 2 * d.dkv)});
  g.q = g.qkv.view(0, {n, d.dq});
  g.k = g.qkv.view(n * d.dq, {n, d.dkv});
  g.v = g.qkv.view(n * (d.dq + d.dkv), {n, d.dkv});
  g.gate_up = a.grads.alloc_act({2 * n * d.dff});
  g.gate = g.gate_up.view(0, {n, d.dff});
  g.up = g.gate_up.view(n * d.dff, {n, d.dff});
  g.gated = a.grads.alloc_act({n, d.dff});
  if (keeps_weight_grad_inputs_)
    for (Tensor& kept : d_out_kept) kept = a.kept.alloc_act({n, d.d_res});
}

Tensor TpBlock::output_grad(Backend& be, const TensorParallel& tp, Tensor d_residual, int which) {
  if (!tp.weight_grads) return d_residual;
  Tensor kept = d_out_kept[size_t(which)];
  BOTTLE_ASSERT(!kept.empty(),
                "a block made without keeping its weight gradients' inputs ran a deferring "
                "backward");
  be.copy(kept, d_residual);
  return kept;
}

TpTask TpBlock::recompute(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                          Tensor out) {
  if (policy_ == Recompute::none) co_return;
  // validate_recompute refused the policies a layout's supports() does not name.
  BOTTLE_ASSERT(policy_ == Recompute::block, "this block cannot recompute \"{}\"",
                recompute_name(policy_));
  const TpPhase phase(tp, kRecomputePhase);
  // A range must not stay open while a half is suspended (the other half's would nest in it):
  // under TP overlap the recomputation is not a range of its own.
  const BackendRange range(be, tp.half ? nullptr : kRecomputeRange);
  co_await forward(be, tp, prev, x, out);
}

BlockLatents TpBlock::latents() const {
  BlockLatents l;
  for (size_t i = 0; i < proj.size(); ++i) {
    l.u[i] = proj[i].u;
    l.du[i] = proj[i].du;
  }
  return l;
}

Tensor prev_latent(const BlockLatents& prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? prev.u[size_t(p)] : Tensor{};
}

Tensor prev_latent_grad(const BlockLatents& prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? prev.du[size_t(p)] : Tensor{};
}

Tensor attention_output(const TpBlock& b) { return b.attention.out.reshaped(b.q.shape); }

int64_t widest_sharded_rank(const TpBlock& b) {
  int64_t widest = 0;
  for (const Projection& p : b.proj)
    if (p.sharded()) widest = std::max(widest, p.rank);
  return widest;
}

void allocate_replicated_norms(const BlockAllocators& a, const TpBlock& b, RMSNorm& norm1,
                               RMSNorm& norm2) {
  const int64_t n = b.dims.rows();
  norm1.weight = b.norm1_weight;
  norm2.weight = b.norm2_weight;
  norm1.eps = norm2.eps = b.norm_eps;
  norm1.allocate_activations(a.recomputed, n, b.dims.d);
  norm2.allocate_activations(a.recomputed, n, b.dims.d);
}

BlockDims head_split_dims(const ModelShape& m, int t, int64_t d_res) {
  BlockDims d;
  d.d = m.hidden;
  d.d_res = d_res;
  d.heads = m.heads / t;
  d.kv_heads = m.kv_heads / t;
  d.head_dim = m.head_dim();
  d.dq = d.heads * d.head_dim;
  d.dkv = d.kv_heads * d.head_dim;
  d.dff = m.ffn / t;
  return d;
}

void check_head_split_divisible(const ModelShape& m, int t) {
  require_divides(t, m.vocab, Setting::vocab_size);
  require_divides(t, m.hidden, Setting::hidden_size);
  require_divides(t, m.ffn, Setting::intermediate_size);
  require_divides(t, m.heads, Setting::num_heads);
  require_divides(t, m.kv_heads, Setting::num_kv_heads);
}

}  // namespace bottle
