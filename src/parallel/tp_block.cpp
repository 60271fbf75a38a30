#include "parallel/tp_block.h"

#include <algorithm>

namespace bottle {
namespace {

Tensor slab_view(Tensor slab, int64_t offset, Shape shape) {
  return Tensor{slab.f32() + offset, shape};
}

int64_t widest_sharded_rank(const TpBlock& b) {
  int64_t widest = 0;
  for (const Projection& p : b.proj)
    if (p.sharded()) widest = std::max(widest, p.rank);
  return widest;
}

}  // namespace

void allocate_block(Arena& arena, const TensorParallel& tp, TpBlock& b) {
  const BlockDims& d = b.dims;
  const int64_t n = d.rows();
  using P = ProjectionId;
  if (tp.mode == TpMode::btp) {
    for (OnlineRMSNorm* norm : {&b.online1, &b.online2}) {
      norm->d = d.d;
      norm->allocate_activations(arena, n, d.d_res);
    }
  } else {
    b.norm1.allocate_activations(arena, n, d.d);
    b.norm2.allocate_activations(arena, n, d.d);
  }
  if (b.bottleneck()) {
    // btp sends each RMSNorm's statistic (N values) in the grouped A's all-reduce.
    const int64_t tail = tp.mode == TpMode::btp ? n : 0;
    const std::array<Projection*, 3> qkv{&b[P::q], &b[P::k], &b[P::v]};
    const std::array<Projection*, 2> gate_up{&b[P::gate], &b[P::up]};
    b.qkv_latent = allocate_grouped_activations(arena, n, qkv, tail);
    b.gate_up_latent = allocate_grouped_activations(arena, n, gate_up, tail);
    b[P::o].allocate_activations(arena, n);
    b[P::down].allocate_activations(arena, n);
  }
  Attention& a = b.attention;
  a.batch = d.batch;
  a.seq = d.seq;
  a.heads = d.heads;
  a.kv_heads = d.kv_heads;
  a.head_dim = d.head_dim;
  a.rope_theta = d.rope_theta;
  a.allocate_activations(arena);
  b.qkv = arena.alloc({n * (d.dq + 2 * d.dkv)});
  b.q = slab_view(b.qkv, 0, {n, d.dq});
  b.k = slab_view(b.qkv, n * d.dq, {n, d.dkv});
  b.v = slab_view(b.qkv, n * (d.dq + d.dkv), {n, d.dkv});
  b.h = arena.alloc({n, d.d_res});
  b.gate_up = arena.alloc({2 * n * d.dff});
  b.gate = slab_view(b.gate_up, 0, {n, d.dff});
  b.up = slab_view(b.gate_up, n * d.dff, {n, d.dff});
  b.gated = arena.alloc({n, d.dff});
  if (const int64_t widest = widest_sharded_rank(b)) b.gather = arena.alloc({2 * n * widest});
}

void allocate_block_gradients(Arena& arena, const TensorParallel& tp, const TpBlock& b,
                              BlockGradients& g) {
  const BlockDims& d = b.dims;
  const int64_t n = d.rows();
  g.residual = arena.alloc({n, d.d_res});
  g.normed = arena.alloc({n, d.d_res});
  g.normed_part = arena.alloc({n, d.d_res});
  g.attn = arena.alloc({n, d.dq});
  g.qkv = arena.alloc({n * (d.dq + 2 * d.dkv)});
  g.q = slab_view(g.qkv, 0, {n, d.dq});
  g.k = slab_view(g.qkv, n * d.dq, {n, d.dkv});
  g.v = slab_view(g.qkv, n * (d.dq + d.dkv), {n, d.dkv});
  g.gate_up = arena.alloc({2 * n * d.dff});
  g.gate = slab_view(g.gate_up, 0, {n, d.dff});
  g.up = slab_view(g.gate_up, n * d.dff, {n, d.dff});
  g.gated = arena.alloc({n, d.dff});
  if (const int64_t widest = widest_sharded_rank(b)) g.gather = arena.alloc({2 * n * widest});
  if (tp.mode == TpMode::btp && b.bottleneck()) {
    int64_t widest_group = 0;
    for (const auto& slabs : {b.qkv_latent, b.gate_up_latent})
      widest_group = std::max(widest_group, slabs.du.numel());
    for (const Projection& p : b.proj) widest_group = std::max(widest_group, p.du.numel());
    g.latent_part = arena.alloc({widest_group});
  }
}

Tensor prev_latent(const TpBlock* prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? (*prev)[p].u : Tensor{};
}

Tensor prev_latent_grad(TpBlock* prev, const TpBlock& b, ProjectionId p) {
  return b[p].crossing ? (*prev)[p].du : Tensor{};
}

Tensor attention_output(const TpBlock& b) { return Tensor{b.attention.out.data, b.q.shape}; }

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
