#include "parallel/tp_block.h"

#include <algorithm>

#include "parallel/tp_layout.h"

namespace bottle {

void allocate_block_buffers(const BlockAllocators& a, Recompute policy, int64_t slab_tail,
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
  if (b.bottleneck()) {
    const std::array<Projection*, 3> qkv{&b[P::q], &b[P::k], &b[P::v]};
    const std::array<Projection*, 2> gate_up{&b[P::gate], &b[P::up]};
    b.qkv_latent = allocate_grouped_activations(from, n, qkv, slab_tail);
    b.gate_up_latent = allocate_grouped_activations(from, n, gate_up, slab_tail);
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
  b.qkv = rest.alloc_act({n * (d.dq + 2 * d.dkv)});
  b.q = b.qkv.view(0, {n, d.dq});
  b.k = b.qkv.view(n * d.dq, {n, d.dkv});
  b.v = b.qkv.view(n * (d.dq + d.dkv), {n, d.dkv});
  b.h = (policy == Recompute::lowrank ? a.kept : rest).alloc_act({n, d.d_res});
  b.gate_up = rest.alloc_act({2 * n * d.dff});
  b.gate = b.gate_up.view(0, {n, d.dff});
  b.up = b.gate_up.view(n * d.dff, {n, d.dff});
  b.gated = rest.alloc_act({n, d.dff});
}

void allocate_block_gradient_buffers(const BlockAllocators& a, const TpBlock& b,
                                     BlockGradients& g) {
  const BlockDims& d = b.dims;
  const int64_t n = d.rows();
  Allocator& grads = a.grads;
  g.residual = grads.alloc_act({n, d.d_res});
  g.normed = grads.alloc_act({n, d.d_res});
  g.attn = grads.alloc_act({n, d.dq});
  g.qkv = grads.alloc_act({n * (d.dq + 2 * d.dkv)});
  g.q = g.qkv.view(0, {n, d.dq});
  g.k = g.qkv.view(n * d.dq, {n, d.dkv});
  g.v = g.qkv.view(n * (d.dq + d.dkv), {n, d.dkv});
  g.gate_up = grads.alloc_act({2 * n * d.dff});
  g.gate = g.gate_up.view(0, {n, d.dff});
  g.up = g.gate_up.view(n * d.dff, {n, d.dff});
  g.gated = grads.alloc_act({n, d.dff});
}

Tensor prev_latent(const TpBlock* prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? (*prev)[p].u : Tensor{};
}

Tensor prev_latent_grad(TpBlock* prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? (*prev)[p].du : Tensor{};
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
