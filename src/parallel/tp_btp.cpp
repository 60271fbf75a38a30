// `btp`: bottleneck-aware TP (BOOST §4.1). Every chunk starts at an up-projection B (split
// by output columns) and ends at the next down-projection A (split by input rows); its one
// all-reduce carries the r-wide latent. The residual stream stays sharded along the hidden
// dim (d/t columns per rank) and RMSNorm runs online inside the chunk (online_rmsnorm.h).
// Chunks of a block, each closed by one all-reduce (grouping on):
//   B_q,B_k,B_v → attention on local heads → A_o                       → r
//   B_o → + residual → online RMSNorm → A_gate,A_up                     → 2r + 1
//   B_gate,B_up → gate ⊙ up → A_down                                   → r
//   B_down → + residual → online RMSNorm → next block's A_q,A_k,A_v     → 3r + 1
// Per block and pass, per token: forward 7·r + 2 (the two RMSNorm statistics), backward
// 7·r (the B's copy_to: ∂u is summed over ranks), + 2 more when the RMSNorm statistic is
// all-reduced instead of taken from the latent. 4 collectives each way; 7 without grouping.
// The latent stage (σ, LaX's crossing and LN_r) runs replicated on the whole latent.
#include "parallel/component_times.h"
#include "parallel/mappings.h"
#include "parallel/projection_group.h"
#include "parallel/tp_block.h"

namespace bottle {
namespace {

using P = ProjectionId;

struct Group {
  std::array<Projection*, 3> members{};
  std::array<ProjectionId, 3> ids{};
  size_t size = 0;
  const char* component = nullptr;  // what tp.times counts its compute under, if anything
  Group(TpBlock& b, std::initializer_list<ProjectionId> list, const char* component = nullptr)
      : component(component) {
    for (ProjectionId id : list) {
      ids[size] = id;
      members[size++] = &b[id];
    }
  }
  ProjectionSpan span() const { return {members.data(), size}; }
  Projection& operator[](size_t i) const { return *members[i]; }
};

std::string site(const char* pass, const Group& g, size_t i) {
  return fmt::format("btp.{}.{}", pass, kProjectionNames[int(g.ids[i])]);
}

// The RMSNorm statistic ΣS travels after a group's latents in its all-reduce slab.
Tensor slab_statistic(Tensor slab, int64_t rows) { return slab.view(slab.numel() - rows, {rows}); }

void latents_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev,
                     const Group& g) {
  const ComponentTimer timer(tp, g.component);
  for (size_t i = 0; i < g.size; ++i) g[i].latent_forward(be, prev_latent(prev, b, g.ids[i]));
}

// All-reduce the A outputs of a group (the statistic, when present, travels after the last
// member's latent, which it follows in memory): one collective with grouping, else one each.
void reduce_latents(const TensorParallel& tp, const Group& g, Tensor slab, int64_t tail,
                    const char* pass, const char* group_site) {
  if (tp.grouping || g.size == 1) {
    copy_to_backward(tp, slab, g.size == 1 ? site(pass, g, 0) : std::string(group_site));
    return;
  }
  for (size_t i = 0; i < g.size; ++i) {
    Tensor z = i == 0 ? g[i].z : g[i].z.reshaped({g[i].z.numel()});
    if (i + 1 == g.size) z = Tensor{z.data, {z.numel() + tail}};
    copy_to_backward(tp, z, site(pass, g, i));
  }
}

// A (row-parallel) → all-reduce → latent stage; `norm` (btp's online RMSNorm) wraps the
// GEMM when the chunk starts at a norm.
void chunk_end_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev,
                       const Group& g, Tensor x, OnlineRMSNorm* norm, Tensor slab,
                       const char* group_site) {
  Tensor sumsq = norm ? slab_statistic(slab, x.rows()) : Tensor{};
  if (norm) {
    norm->forward_local(be, x, sumsq);
    x = norm->out;
  }
  {
    const ComponentTimer timer(tp, g.component);
    group_down_forward(be, g.span(), x, tp.grouping);
  }
  std::array<Tensor, 3> z{};
  for (size_t i = 0; i < g.size && i < z.size(); ++i) z[i] = g[i].z;
  if (norm) norm->scale_partials(be, {z.data(), g.size}, sumsq);
  reduce_latents(tp, g, slab, norm ? sumsq.numel() : 0, "fwd", group_site);
  if (norm) norm->finish(be, {z.data(), g.size}, sumsq);
  latents_forward(be, tp, b, prev, g);
}

// The chunk's start in backward: B's (column-parallel) latent gradient is a partial sum;
// copy_to's backward all-reduces it, then the latent stage runs on the whole latent.
void chunk_start_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev,
                          BlockGradients& grads, const Group& g, std::span<const Tensor> dys,
                          const char* group_site) {
  std::array<Tensor, 3> parts{};
  int64_t offset = 0;
  for (size_t i = 0; i < g.size; ++i) {
    parts[i] = grads.latent_part.view(offset, g[i].du.shape);
    offset += g[i].du.numel();
  }
  // The crossing of the next block may already have added its share to du, so B's partial
  // sum goes to a buffer of its own.
  {
    const ComponentTimer timer(tp, g.component);
    group_up_backward(be, g.span(), dys, {parts.data(), g.size}, false, tp.grouping);
  }
  if (tp.grouping || g.size == 1) {
    copy_to_backward(tp, grads.latent_part.view(0, {offset}),
                     g.size == 1 ? site("bwd", g, 0) : std::string(group_site));
  } else {
    for (size_t i = 0; i < g.size; ++i) copy_to_backward(tp, parts[i], site("bwd", g, i));
  }
  const ComponentTimer timer(tp, g.component);
  for (size_t i = 0; i < g.size; ++i) {
    be.accumulate(g[i].du, parts[i]);
    g[i].latent_backward(be, prev_latent(prev, b, g.ids[i]), prev_latent_grad(prev, b, g.ids[i]));
  }
}

// A's backward is local (row-parallel: each rank's input columns). With a norm in front,
// dn goes through the online RMSNorm's backward into dx (+=); else dx = ∂/∂x.
void chunk_end_backward(Backend& be, const TensorParallel& tp, const Group& g, Tensor dx, Tensor x,
                        OnlineRMSNorm* norm, Tensor dn, Tensor residual_in, const char* stat_site) {
  if (!norm) {
    const ComponentTimer timer(tp, g.component);
    group_down_backward(be, g.span(), dx, x, false, tp.grouping);
    return;
  }
  if (tp.norm_backward == NormStatistic::from_latent) {
    // Before group_down_backward zeroes du (svd: dz is du).
    std::array<std::pair<Tensor, Tensor>, 3> latents{};
    for (size_t i = 0; i < g.size && i < latents.size(); ++i) latents[i] = {g[i].z, g[i].dz};
    norm->latent_statistic(be, {latents.data(), g.size});
  }
  {
    const ComponentTimer timer(tp, g.component);
    group_down_backward(be, g.span(), dn, norm->out, false, tp.grouping);
  }
  norm->backward(be, tp, dx, dn, residual_in, stat_site);
}

}  // namespace

void btp_block_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev,
                       Tensor x, Tensor out) {
  const Group qkv(b, {P::q, P::k, P::v}, "qkv"), o(b, {P::o}),
      gate_up(b, {P::gate, P::up}, "gate_up"), down(b, {P::down});
  chunk_end_forward(be, tp, b, prev, qkv, x, &b.online1, b.qkv_latent.z, "btp.fwd.qkv");
  // B's are column-parallel: copy_to's forward is the identity on the whole latent.
  const std::array<Tensor, 3> qkv_out{b.q, b.k, b.v};
  {
    const ComponentTimer timer(tp, qkv.component);
    group_up_forward(be, qkv.span(), qkv_out, tp.grouping);
  }
  b.attention.forward(be, b.q, b.k, b.v);
  chunk_end_forward(be, tp, b, prev, o, attention_output(b), nullptr, b[P::o].z, "");
  b[P::o].up_forward(be, b.h, false);
  be.add(b.h, b.h, x);
  chunk_end_forward(be, tp, b, prev, gate_up, b.h, &b.online2, b.gate_up_latent.z,
                    "btp.fwd.gate_up");
  const std::array<Tensor, 2> gate_up_out{b.gate, b.up};
  {
    const ComponentTimer timer(tp, gate_up.component);
    group_up_forward(be, gate_up.span(), gate_up_out, tp.grouping);
  }
  be.swiglu_forward(b.gated, b.gate, b.up, b.dims.gate_act);
  chunk_end_forward(be, tp, b, prev, down, b.gated, nullptr, b[P::down].z, "");
  b[P::down].up_forward(be, out, false);
  be.add(out, out, b.h);
}

void btp_block_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev, Tensor x,
                        BlockGradients& g) {
  const Group qkv(b, {P::q, P::k, P::v}, "qkv"), o(b, {P::o}),
      gate_up(b, {P::gate, P::up}, "gate_up"), down(b, {P::down});
  const std::array<Tensor, 1> d_res{g.residual};
  chunk_start_backward(be, tp, b, prev, g, down, d_res, "");
  chunk_end_backward(be, tp, down, g.gated, b.gated, nullptr, {}, {}, "");
  be.fill_zero(g.gate_up);
  be.swiglu_backward(g.gate, g.up, g.gated, b.gate, b.up, b.dims.gate_act);
  const std::array<Tensor, 2> d_gate_up{g.gate, g.up};
  chunk_start_backward(be, tp, b, prev, g, gate_up, d_gate_up, "btp.bwd.gate_up");
  chunk_end_backward(be, tp, gate_up, g.residual, b.h, &b.online2, g.normed, b.h,
                     "btp.bwd.norm2_stat");
  chunk_start_backward(be, tp, b, prev, g, o, d_res, "");
  chunk_end_backward(be, tp, o, g.attn, attention_output(b), nullptr, {}, {}, "");
  be.fill_zero(g.qkv);
  b.attention.backward(be, g.q, g.k, g.v, g.attn, b.q, b.k, b.v);
  const std::array<Tensor, 3> d_qkv{g.q, g.k, g.v};
  chunk_start_backward(be, tp, b, prev, g, qkv, d_qkv, "btp.bwd.qkv");
  chunk_end_backward(be, tp, qkv, g.residual, x, &b.online1, g.normed, x, "btp.bwd.norm1_stat");
}

// The chunks' insides from what lowrank keeps: the latents z after each all-reduce (ΣS in
// their slabs' tails), x and h; every step below is local to this rank.
void btp_block_recompute_lowrank(Backend& be, const TensorParallel& tp, TpBlock& b,
                                 const TpBlock* prev, Tensor x) {
  const Group qkv(b, {P::q, P::k, P::v}, "qkv"), o(b, {P::o}),
      gate_up(b, {P::gate, P::up}, "gate_up"), down(b, {P::down});
  const int64_t n = x.rows();
  b.online1.recompute(be, x, slab_statistic(b.qkv_latent.z, n));
  latents_forward(be, tp, b, prev, qkv);
  const std::array<Tensor, 3> qkv_out{b.q, b.k, b.v};
  {
    const ComponentTimer timer(tp, qkv.component);
    group_up_forward(be, qkv.span(), qkv_out, tp.grouping);
  }
  b.attention.forward(be, b.q, b.k, b.v);
  latents_forward(be, tp, b, prev, o);
  b.online2.recompute(be, b.h, slab_statistic(b.gate_up_latent.z, n));
  latents_forward(be, tp, b, prev, gate_up);
  const std::array<Tensor, 2> gate_up_out{b.gate, b.up};
  {
    const ComponentTimer timer(tp, gate_up.component);
    group_up_forward(be, gate_up.span(), gate_up_out, tp.grouping);
  }
  be.swiglu_forward(b.gated, b.gate, b.up, b.dims.gate_act);
  latents_forward(be, tp, b, prev, down);
}

}  // namespace bottle
