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
// In bf16 the latents travel in bf16 and each RMSNorm statistic, which stays fp32, in an
// all-reduce of its own (the same elements, 2 more collectives forward).
// The latent stage (σ, LaX's crossing and LN_r) runs replicated on the whole latent.
// Embedding and LM head: the LM head is split by vocabulary rows. An untied table is split by
// hidden columns, so each rank looks up its own residual shard without communication; a tied
// one by vocabulary rows like the head, its rows summed by an all-reduce of N·d, each rank
// keeping its columns. The last residual is all-gathered (N·d) before the final norm.
#include <algorithm>
#include <vector>

#include "parallel/mappings.h"
#include "parallel/online_rmsnorm.h"
#include "parallel/projection_group.h"
#include "parallel/tp_layout.h"

namespace bottle {
namespace {

using P = ProjectionId;

// The block: every A split by its input columns, every B by its output rows, the residual
// stream and the norms by d/t.
class BtpBlock final : public TpBlock {
 public:
  BtpBlock(const TpLayout& layout, const BlockSpec& spec, const BlockAllocators& a);
  TpTask forward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                 Tensor out) override;
  TpTask backward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                  Tensor d_residual) override;
  // lowrank: each chunk's inside from the kept latents, h and x; no collective.
  TpTask recompute(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                   Tensor out) override;

  OnlineRMSNorm online1, online2;  // this rank's d/t columns
  Tensor sumsq1, sumsq2;           // [N] fp32 ΣS of each norm when the latent slabs are bf16
  Tensor latent_part;  // [N·Σr] LaX: B's partial latent gradients before their all-reduce (comm)
};

struct Group {
  std::array<Projection*, 3> members{};
  std::array<ProjectionId, 3> ids{};
  size_t size = 0;
  // A group's name ("qkv", "gate_up"): the call site of its collectives and the backend range
  // its compute runs in (TpComponent); null for one projection, named by its own sites.
  const char* name = nullptr;
  Group(TpBlock& b, std::span<const ProjectionId> list, const char* name = nullptr) : name(name) {
    for (ProjectionId id : list) {
      ids[size] = id;
      members[size++] = &b[id];
    }
  }
  ProjectionSpan span() const { return {members.data(), size}; }
  Projection& operator[](size_t i) const { return *members[i]; }
};

// The call site of a collective of a group or a projection, forward or backward.
std::string btp_site(std::string_view pass, std::string_view name) {
  return fmt::format("btp.{}.{}", pass, name);
}
// Member i's own, or the group's.
std::string site(const char* pass, const Group& g, size_t i) {
  return btp_site(pass, kProjectionNames[int(g.ids[i])]);
}
std::string group_site(const char* pass, const Group& g) {
  return g.size == 1 ? site(pass, g, 0) : btp_site(pass, g.name);
}

constexpr std::array<ProjectionId, 3> kQkv{P::q, P::k, P::v};
constexpr std::array<ProjectionId, 2> kGateUp{P::gate, P::up};
constexpr std::array<ProjectionId, 1> kO{P::o};
constexpr std::array<ProjectionId, 1> kDown{P::down};

// The RMSNorm statistic ΣS travels after a group's latents in its all-reduce slab, or in a
// buffer of its own (`own`) where the slab is bf16.
Tensor norm_statistic(Tensor slab, Tensor own, int64_t rows) {
  return own.empty() ? slab.view(slab.numel() - rows, {rows}) : own;
}

void latents_forward(Backend& be, TpBlock& b, const BlockLatents& prev, const Group& g) {
  std::array<Tensor, 3> u_prev{};
  for (size_t i = 0; i < g.size; ++i) u_prev[i] = prev_latent(prev, b, g.ids[i]);
  const BackendRange range(be, g.name);
  group_latent_forward(be, g.span(), {u_prev.data(), g.size});
}

// reduce_from's forward on the A outputs of a group (the statistic, when present, travels
// after the last member's latent, which it follows in memory): one all-reduce with grouping,
// else one each.
TpTask reduce_latents(const TensorParallel& tp, const Group& g, Tensor slab, int64_t tail,
                      const char* pass) {
  if (tp.grouping || g.size == 1) {
    co_await co_reduce_from_forward(tp, slab, group_site(pass, g));
    co_return;
  }
  BOTTLE_ASSERT(!g[0].interleaved(), "btp: one all-reduce per member needs stacked latents");
  int64_t offset = 0;  // of member i's latent in the slab
  for (size_t i = 0; i < g.size; ++i) {
    const int64_t count = g[i].z.numel() + (i + 1 == g.size ? tail : 0);
    const Tensor member = slab.view(offset, {count});
    co_await co_reduce_from_forward(tp, member, site(pass, g, i));
    offset += g[i].z.numel();
  }
}

// A (row-parallel) → all-reduce → latent stage; `norm` (btp's online RMSNorm) wraps the
// GEMM when the chunk starts at a norm.
TpTask chunk_end_forward(Backend& be, const TensorParallel& tp, TpBlock& b,
                         const BlockLatents& prev, const Group& g, Tensor x, OnlineRMSNorm* norm,
                         Tensor slab, Tensor own_sumsq) {
  const Tensor sumsq = norm ? norm_statistic(slab, own_sumsq, x.rows()) : Tensor{};
  if (norm) {
    norm->forward_local(be, x, sumsq);
    x = norm->out;
  }
  {
    const BackendRange range(be, g.name);
    group_down_forward(be, g.span(), x, tp.grouping);
  }
  const std::vector<Tensor> z = rows_of(g.span(), &Projection::z);
  if (norm) norm->scale_partials(be, z, sumsq);
  const bool stat_in_slab = norm && own_sumsq.empty();
  co_await reduce_latents(tp, g, slab, stat_in_slab ? sumsq.numel() : 0, "fwd");
  if (norm && !stat_in_slab)
    co_await co_reduce_from_forward(tp, sumsq, group_site("fwd", g) + ".stat");
  if (norm) norm->finish(be, z, sumsq);
  latents_forward(be, b, prev, g);
}

// The chunk's start: B (column-parallel) on the whole latents, copy_to's forward; its
// backward, in chunk_start_backward, sums B's partial latent gradients.
void chunk_start_forward(Backend& be, const TensorParallel& tp, const Group& g,
                         std::span<const Tensor> outputs) {
  for (size_t i = 0; i < g.size; ++i) copy_to_forward(tp, g[i].u);
  const BackendRange range(be, g.name);
  group_up_forward(be, g.span(), outputs, tp.grouping);
}

// The group's latent gradients as one flat tensor: they lie one after another (its du slab, or
// the one du of a single projection).
Tensor group_du(const Group& g) {
  const Tensor du = flat(g.span(), &Projection::du);
  BOTTLE_ASSERT(!du.empty(), "btp: the latent gradients of a group are not one after another");
  return du;
}

// The chunk's start in backward: B's (column-parallel) latent gradient is a partial sum;
// copy_to's backward all-reduces it, then the latent stage runs on the whole latent.
TpTask chunk_start_backward(Backend& be, const TensorParallel& tp, BtpBlock& b,
                            const BlockLatents& prev, const Group& g, std::span<const Tensor> dys) {
  // Under LaX the crossing of the next block may already have added its share to du, so B's
  // partial sum goes to a buffer of its own and is added after the all-reduce. Otherwise B's
  // product is du's only producer: it is written into du and all-reduced there.
  const bool shared = g[0].shares_du();
  const Tensor du = group_du(g);  // [Σ N·r], or [N, Σr] interleaved
  std::array<Tensor, 3> parts{};  // shared: B's partial sums, stacked like du
  int64_t offset = 0;
  for (size_t i = 0; shared && i < g.size; ++i) {
    parts[i] = b.latent_part.view(offset, g[i].du.shape);
    offset += g[i].du.numel();
  }
  const Tensor whole = shared ? b.latent_part.view(0, {du.numel()}) : du;
  // B's input gradient, then its weight gradient dB while the input gradient's sum travels
  // (TpBackward): the whole group's at once with grouping, else member by member.
  auto input_grad = [&](ProjectionSpan members, std::span<const Tensor> d_out,
                        std::span<const Tensor> partials) {
    const BackendRange range(be, g.name);
    group_up_input_grad(be, members, d_out, partials, false, tp.grouping);
  };
  // Owns its members and their output gradients: it may run in the W pass.
  auto weight_grad = [&](ProjectionSpan members, std::span<const Tensor> d_out) {
    return [&be, grouping = tp.grouping, name = g.name,
            m = std::vector<Projection*>(members.begin(), members.end()),
            d = std::vector<Tensor>(d_out.begin(), d_out.end())] {
      const BackendRange range(be, name);
      group_up_weight_grad(be, m, d, grouping);
    };
  };
  if (tp.grouping || g.size == 1) {
    input_grad(g.span(), dys, {parts.data(), shared ? g.size : 0});
    // (Named: g++ 12 destroys a lambda made inside a co_await expression twice.)
    auto dB = weight_grad(g.span(), dys);
    co_await co_copy_to_backward(tp, whole, group_site("bwd", g), std::move(dB));
  } else {
    for (size_t i = 0; i < g.size; ++i) {
      const ProjectionSpan member = g.span().subspan(i, 1);
      const std::span<const Tensor> d_out = dys.subspan(i, 1);
      input_grad(member, d_out,
                 shared ? std::span<const Tensor>(&parts[i], 1) : std::span<const Tensor>{});
      auto dB = weight_grad(member, d_out);
      co_await co_copy_to_backward(tp, shared ? parts[i] : g[i].du, site("bwd", g, i),
                                   std::move(dB));
    }
  }
  std::array<Tensor, 3> u_prev{}, du_prev{};
  for (size_t i = 0; i < g.size; ++i) {
    u_prev[i] = prev_latent(prev, b, g.ids[i]);
    du_prev[i] = prev_latent_grad(prev, b, g.ids[i]);
  }
  const BackendRange range(be, g.name);
  if (shared)
    for (size_t i = 0; i < g.size; ++i) be.accumulate(g[i].du, parts[i]);
  group_latent_backward(be, g.span(), {u_prev.data(), g.size}, {du_prev.data(), g.size});
}

// A's backward is local (row-parallel: each rank's input columns; the latent gradient is
// whole on every rank). With a norm in front, dn goes through the online RMSNorm's backward
// into dx (+=); else dx = ∂/∂x.
TpTask chunk_end_backward(Backend& be, const TensorParallel& tp, const Group& g, Tensor dx,
                          Tensor x, OnlineRMSNorm* norm, Tensor dn, Tensor residual_in,
                          const char* stat_site) {
  for (size_t i = 0; i < g.size; ++i) reduce_from_backward(tp, g[i].dz);
  // A's weight gradient reads dz and A's input: now, or in the W pass.
  auto weight_grad = [&](Tensor input) {
    tp.weight_grad([&be, grouping = tp.grouping, name = g.name,
                    m = std::vector<Projection*>(g.members.begin(), g.members.begin() + g.size),
                    input] {
      const BackendRange range(be, name);
      group_down_weight_grad(be, m, input, grouping);
    });
  };
  if (!norm) {
    {
      const BackendRange range(be, g.name);
      group_down_input_grad(be, g.span(), dx, false, tp.grouping);
    }
    weight_grad(x);
    co_return;
  }
  if (tp.norm_backward == NormStatistic::from_latent) {
    // Before A's weight gradient zeroes a shared du (svd: dz is du).
    const std::vector<Tensor> z = rows_of(g.span(), &Projection::z),
                              dz = rows_of(g.span(), &Projection::dz);
    std::vector<std::pair<Tensor, Tensor>> latents;
    for (size_t i = 0; i < z.size(); ++i) latents.emplace_back(z[i], dz[i]);
    norm->latent_statistic(be, latents);
  }
  {
    const BackendRange range(be, g.name);
    group_down_input_grad(be, g.span(), dn, false, tp.grouping);
  }
  weight_grad(norm->out);
  co_await norm->backward(be, tp, dx, dn, residual_in, stat_site);
}

BtpBlock::BtpBlock(const TpLayout& layout, const BlockSpec& spec, const BlockAllocators& a)
    : TpBlock(layout, spec) {
  const int64_t n = dims.rows();
  online1.weight = norm1_weight;
  online2.weight = norm2_weight;
  for (OnlineRMSNorm* norm : {&online1, &online2}) {
    norm->eps = norm_eps;
    norm->d = dims.d;
    norm->one_rank = spec.t == 1;
    norm->allocate_activations(a.recomputed, n, dims.d_res);
  }
  // Each RMSNorm's statistic (N values) rides in its grouped A's all-reduce, unless the
  // latents are bf16: the statistic stays fp32, in a buffer kept like the latents.
  const bool own_statistic = a.kept.act_dtype() != DType::f32;
  allocate_buffers(a, own_statistic ? 0 : n);
  if (own_statistic) {
    sumsq1 = a.kept.alloc({n});
    sumsq2 = a.kept.alloc({n});
  }
  // B's partial latent gradients need a buffer of their own only where du is shared (LaX).
  if (!bottleneck() || !proj[0].shares_du()) return;
  int64_t widest_group = 0;
  for (const auto& slabs : {qkv_latent, gate_up_latent})
    widest_group = std::max(widest_group, slabs.du.numel());
  for (const Projection& p : proj) widest_group = std::max(widest_group, p.du.numel());
  latent_part = a.comm.alloc_act({widest_group});
}

TpTask BtpBlock::forward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                         Tensor out) {
  BtpBlock& b = *this;
  const Group qkv_group(b, kQkv, "qkv"), o(b, kO), gate_up_group(b, kGateUp, "gate_up"),
      down(b, kDown);
  co_await chunk_end_forward(be, tp, b, prev, qkv_group, x, &b.online1, b.qkv_latent.z, b.sumsq1);
  const std::array<Tensor, 3> qkv_out{b.q, b.k, b.v};
  chunk_start_forward(be, tp, qkv_group, qkv_out);
  b.attention.forward(be, b.q, b.k, b.v);
  co_await chunk_end_forward(be, tp, b, prev, o, attention_output(b), nullptr, b[P::o].z, {});
  copy_to_forward(tp, b[P::o].u);
  b[P::o].up_forward(be, b.h, x);  // h = x + B_o u: the residual add is the GEMM's
  co_await chunk_end_forward(be, tp, b, prev, gate_up_group, b.h, &b.online2, b.gate_up_latent.z,
                             b.sumsq2);
  const std::array<Tensor, 2> gate_up_out{b.gate, b.up};
  chunk_start_forward(be, tp, gate_up_group, gate_up_out);
  be.swiglu_forward(b.gated, b.gate, b.up, b.dims.gate_act);
  co_await chunk_end_forward(be, tp, b, prev, down, b.gated, nullptr, b[P::down].z, {});
  copy_to_forward(tp, b[P::down].u);
  b[P::down].up_forward(be, out, b.h);
}

TpTask BtpBlock::backward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                          Tensor d_residual) {
  BtpBlock& b = *this;
  BlockGradients& g = grad;
  const Group qkv_group(b, kQkv, "qkv"), o(b, kO), gate_up_group(b, kGateUp, "gate_up"),
      down(b, kDown);
  const std::array<Tensor, 1> d_mlp_out{b.output_grad(be, tp, d_residual, kMlpOut)};
  co_await chunk_start_backward(be, tp, b, prev, down, d_mlp_out);
  co_await chunk_end_backward(be, tp, down, g.gated, b.gated, nullptr, {}, {}, "");
  be.swiglu_backward(g.gate, g.up, g.gated, b.gate, b.up, b.dims.gate_act);
  const std::array<Tensor, 2> d_gate_up{g.gate, g.up};
  co_await chunk_start_backward(be, tp, b, prev, gate_up_group, d_gate_up);
  co_await chunk_end_backward(be, tp, gate_up_group, d_residual, b.h, &b.online2, g.normed, b.h,
                              "btp.bwd.norm2_stat");
  const std::array<Tensor, 1> d_attn_out{b.output_grad(be, tp, d_residual, kAttnOut)};
  co_await chunk_start_backward(be, tp, b, prev, o, d_attn_out);
  co_await chunk_end_backward(be, tp, o, g.attn, attention_output(b), nullptr, {}, {}, "");
  b.attention.backward(be, g.q, g.k, g.v, g.attn, b.q, b.k, b.v);
  const std::array<Tensor, 3> d_qkv{g.q, g.k, g.v};
  co_await chunk_start_backward(be, tp, b, prev, qkv_group, d_qkv);
  co_await chunk_end_backward(be, tp, qkv_group, d_residual, x, &b.online1, g.normed, x,
                              "btp.bwd.norm1_stat");
}

// The chunks' insides from what lowrank keeps: the latents z after each all-reduce (ΣS in
// their slabs' tails, or in buffers of their own in bf16), x and h; every step below is local
// to this rank.
TpTask BtpBlock::recompute(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                           Tensor out) {
  if (policy() != Recompute::lowrank) {
    co_await TpBlock::recompute(be, tp, prev, x, out);
    co_return;
  }
  const TpPhase phase(tp, kRecomputePhase);
  // A range must not stay open while a half is suspended (the other half's would nest in it):
  // under TP overlap the recomputation is not a range of its own.
  const BackendRange range(be, tp.half ? nullptr : kRecomputeRange);
  BtpBlock& b = *this;
  const Group qkv_group(b, kQkv, "qkv"), o(b, kO), gate_up_group(b, kGateUp, "gate_up"),
      down(b, kDown);
  const int64_t n = x.rows();
  b.online1.recompute(be, x, norm_statistic(b.qkv_latent.z, b.sumsq1, n));
  latents_forward(be, b, prev, qkv_group);
  const std::array<Tensor, 3> qkv_out{b.q, b.k, b.v};
  chunk_start_forward(be, tp, qkv_group, qkv_out);
  b.attention.forward(be, b.q, b.k, b.v);
  latents_forward(be, b, prev, o);
  b.online2.recompute(be, b.h, norm_statistic(b.gate_up_latent.z, b.sumsq2, n));
  latents_forward(be, b, prev, gate_up_group);
  const std::array<Tensor, 2> gate_up_out{b.gate, b.up};
  chunk_start_forward(be, tp, gate_up_group, gate_up_out);
  be.swiglu_forward(b.gated, b.gate, b.up, b.dims.gate_act);
  latents_forward(be, b, prev, down);
}

// A timed group and the call sites of its all-reduces, grouped and per member.
TpComponent component(const char* group, std::span<const ProjectionId> members) {
  TpComponent c{group, {btp_site("fwd", group), btp_site("bwd", group)}};
  for (ProjectionId id : members) {
    c.sites.push_back(btp_site("fwd", kProjectionNames[int(id)]));
    c.sites.push_back(btp_site("bwd", kProjectionNames[int(id)]));
  }
  return c;
}

class BtpLayout final : public TpLayout {
 public:
  const char* name() const override { return "btp"; }

  bool fits(BottleneckKind kind) const override { return kind != BottleneckKind::none; }
  const char* requirement() const override { return "needs a bottleneck model"; }
  void check_divisible(const ModelShape& m, int t) const override {
    check_head_split_divisible(m, t);
  }
  // lowrank keeps the chunk boundaries, the r-wide latents: rebuilding the insides is local.
  bool supports(Recompute policy, const ModelShape& m) const override {
    return policy != Recompute::lowrank || m.low_rank();
  }
  const char* why_not(Recompute) const override { return "the model has no latents to keep"; }

  // Every A by its input columns, every B by its output rows; the norms by d/t.
  ParameterSplits parameter_splits(const ModelShape& m) const override {
    ParameterSplits s;
    s.embedding = ends(m).hidden_split_embedding ? 1 : 0;
    s.block_norm = 0;
    s.A.fill(1);
    s.B.fill(0);
    s.lm_head = 0;
    return s;
  }
  ModelEnds ends(const ModelShape& m) const override {
    return {.sharded_residual = true, .hidden_split_embedding = !m.tied_embeddings};
  }
  BlockDims block_dims(const ModelShape& m, int t) const override {
    return head_split_dims(m, t, /*d_res=*/m.hidden / t);
  }
  ProjectionDims projection_dims(const ModelShape& m, ProjectionId p, int t, int) const override {
    return {.d_in = m.d_in(p) / t, .d_out = m.d_out(p) / t, .rank = m.rank_of(p)};
  }

  std::unique_ptr<TpBlock> make_block(const BlockSpec& spec,
                                      const BlockAllocators& a) const override {
    return std::make_unique<BtpBlock>(*this, spec, a);
  }
  // The q/k/v and gate/up groups (the RMSNorm statistic's own sites belong to neither).
  std::vector<TpComponent> components() const override {
    return {component("qkv", kQkv), component("gate_up", kGateUp)};
  }
};

}  // namespace

const TpLayout& btp_tp_layout() {
  static const BtpLayout layout;
  return layout;
}

}  // namespace bottle
