// `vanilla`: Megatron TP applied naively to a bottleneck model (the paper's baseline). Each
// factor pair is one Megatron chunk: copy_to, A split along r (d_in → r/t), σ on the local
// r/t, B split along r (r/t → d_out), reduce_from of the full-width output. Norms,
// attention over all heads and SwiGLU run replicated on full-width tensors.
// Per block and pass, per token (MHA; GQA: q, k, v give d + 2·d_kv instead of 3·d):
//   forward   5·d + 2·d_ff       (q, k, v, o, gate, up, down outputs)
//   backward  grouping off: 6·d + d_ff (each chunk's copy_to: q, k, v, gate, up on d;
//             o on d; down on d_ff);  grouping on: 3·d + d_ff (one copy_to per input)
//   collectives: 7 each way; with grouping 4.
// LaX: its crossing needs the whole latent, so each projection all-gathers its r/t slice
// of z (forward) and of ∂u (backward): + 7·r per pass (7 more all-gathers each way).
// Embedding and LM head: both split by vocabulary rows; the embedding's rows are summed by one
// all-reduce of N·d, and the residual reaches the final norm whole.
#include "nn/rmsnorm.h"
#include "parallel/mappings.h"
#include "parallel/projection_group.h"
#include "parallel/tp_layout.h"

namespace bottle {
namespace {

using P = ProjectionId;

// The block: every A split by its r rows, every B by its r columns, the rest replicated.
class VanillaBlock final : public TpBlock {
 public:
  VanillaBlock(const TpLayout& layout, const BlockSpec& spec, const BlockAllocators& a);
  TpTask forward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                 Tensor out) override;
  TpTask backward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                  Tensor d_residual) override;

  RMSNorm norm1, norm2;  // whole rows, replicated
  Tensor gather;         // [2·N·r] LaX: the all-gather's scratch of a latent (comm)
  Tensor normed_part;    // [N, d] one projection's input gradient before its own all-reduce
  Tensor grad_gather;    // [2·N·r] LaX: the all-gather's scratch, then the gathered ∂u (comm)
};

struct Chunk {
  std::array<Projection*, 3> members;
  size_t size;
  ProjectionSpan span() const { return {members.data(), size}; }
};

// The latent stage of each member, after gathering LaX's sharded latents.
TpTask latents_forward(Backend& be, const TensorParallel& tp, VanillaBlock& b,
                       const BlockLatents& prev, ProjectionSpan group,
                       std::span<const ProjectionId> ids, const char* component) {
  std::array<Tensor, 3> u_prev{};
  for (size_t i = 0; i < group.size(); ++i) {
    Projection& p = *group[i];
    // gather's backward (keep own slice of dz) is A's strided backward, which reads dz's
    // columns from shard_offset: no call of its own.
    if (p.sharded())
      co_await co_gather_last_dim_forward(be, tp, p.z, p.z_shard, b.gather,
                                          "vanilla.fwd.lax_gather");
    u_prev[i] = prev_latent(prev, b, ids[i]);
  }
  const BackendRange range(be, component);
  group_latent_forward(be, group, {u_prev.data(), group.size()});
}

TpTask latents_backward(Backend& be, const TensorParallel& tp, VanillaBlock& b,
                        const BlockLatents& prev, ProjectionSpan group,
                        std::span<const ProjectionId> ids, const char* component) {
  std::array<Tensor, 3> u_prev{}, du_prev{};
  for (size_t i = 0; i < group.size(); ++i) {
    Projection& p = *group[i];
    u_prev[i] = prev_latent(prev, b, ids[i]);
    du_prev[i] = prev_latent_grad(prev, b, ids[i]);
    if (!p.sharded()) continue;
    const int64_t n = p.du.rows();
    const Tensor whole = b.grad_gather.view(n * p.rank, {n, p.rank});  // after the gather's own
    // B reads its columns of u (scatter's forward, inside B's strided GEMM): its backward
    // all-gathers the slices of ∂u.
    co_await co_scatter_last_dim_backward(be, tp, whole, p.du_shard, b.grad_gather,
                                          "vanilla.bwd.lax_gather");
    const BackendRange range(be, component);
    be.accumulate(p.du, whole);
  }
  const BackendRange range(be, component);
  group_latent_backward(be, group, {u_prev.data(), group.size()}, {du_prev.data(), group.size()});
}

// The call sites of a chunk's all-reduces (a group's, or a projection's): forward, of its
// output; backward, of its input's gradient.
std::string forward_site(std::string_view chunk) {
  return fmt::format("vanilla.fwd.{}_out", chunk);
}
std::string backward_site(std::string_view chunk) {
  return fmt::format("vanilla.bwd.{}_in", chunk);
}

// outputs_p = chunk_p(x), then reduce_from: one all-reduce over the contiguous outputs
// with grouping, else one per projection. `chunk` names the group; `timed`: its compute runs
// in a backend range of that name (TpComponent).
TpTask chunks_forward(Backend& be, const TensorParallel& tp, VanillaBlock& b,
                      const BlockLatents& prev, std::span<const ProjectionId> ids, Tensor x,
                      std::span<const Tensor> outputs, Tensor outputs_slab, const char* chunk,
                      bool timed) {
  const char* component = timed ? chunk : nullptr;
  std::array<Projection*, 3> members{};
  for (size_t i = 0; i < ids.size(); ++i) members[i] = &b[ids[i]];
  const ProjectionSpan group{members.data(), ids.size()};
  copy_to_forward(tp, x);
  {
    const BackendRange range(be, component);
    group_down_forward(be, group, x, tp.grouping);
  }
  co_await latents_forward(be, tp, b, prev, group, ids, component);
  {
    // A sharded B reads its columns of u inside its strided GEMM: scatter's forward.
    const BackendRange range(be, component);
    group_up_forward(be, group, outputs, tp.grouping);
  }
  if (tp.grouping) {
    co_await co_reduce_from_forward(tp, outputs_slab, forward_site(chunk));
    co_return;
  }
  for (size_t i = 0; i < ids.size(); ++i)
    co_await co_reduce_from_forward(tp, outputs[i], forward_site(kProjectionNames[int(ids[i])]));
}

// dx = Σ_p ∂/∂x of chunk_p given dys; copy_to's backward all-reduces the input gradient:
// once for the sum with grouping, else once per projection. The weight gradients (dB, dA) run
// while it travels (TpBackward): they read dy, u, dz and x, none of which the rest changes.
TpTask chunks_backward(Backend& be, const TensorParallel& tp, VanillaBlock& b,
                       const BlockLatents& prev, std::span<const ProjectionId> ids, Tensor x,
                       std::span<const Tensor> dys, Tensor dx, const char* chunk, bool timed) {
  const char* component = timed ? chunk : nullptr;
  std::array<Projection*, 3> members{};
  for (size_t i = 0; i < ids.size(); ++i) members[i] = &b[ids[i]];
  const ProjectionSpan group{members.data(), ids.size()};
  // dys are whole on every rank. A whole LaX du may hold the next block's crossing share
  // already: B's product adds to it (a sharded one is gathered, then added); any other du
  // has B's product as its only producer, which writes it.
  for (const Tensor& dy : dys) reduce_from_backward(tp, dy);
  const bool adds = !members[0]->sharded() && members[0]->shares_du();
  {
    const BackendRange range(be, component);
    group_up_input_grad(be, group, dys, {}, adds, tp.grouping);
  }
  co_await latents_backward(be, tp, b, prev, group, ids, component);
  // Members [begin, end)'s dB and dA, owning what they name: they may run in the W pass.
  auto weight_grads = [&](size_t begin, size_t end) {
    return [&be, component, grouping = tp.grouping, x,
            m = std::vector<Projection*>(group.begin() + begin, group.begin() + end),
            d = std::vector<Tensor>(dys.begin() + begin, dys.begin() + end)] {
      const BackendRange range(be, component);
      group_up_weight_grad(be, m, d, grouping);
      group_down_weight_grad(be, m, x, grouping);
    };
  };
  if (tp.grouping) {
    {
      const BackendRange range(be, component);
      group_down_input_grad(be, group, dx, false, true);
    }
    // (Named: g++ 12 destroys a lambda made inside a co_await expression twice.)
    auto dBA = weight_grads(0, ids.size());
    co_await co_copy_to_backward(tp, dx, backward_site(chunk), std::move(dBA));
    co_return;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Tensor part = i == 0 ? dx : b.normed_part.reshaped(dx.shape);
    {
      const BackendRange range(be, component);
      group_down_input_grad(be, group.subspan(i, 1), part, false, false);
    }
    auto dBA = weight_grads(i, i + 1);
    co_await co_copy_to_backward(tp, part, backward_site(kProjectionNames[int(ids[i])]),
                                 std::move(dBA));
    if (i > 0) {
      const BackendRange range(be, component);
      be.accumulate(dx, part);
    }
  }
}

constexpr std::array<ProjectionId, 3> kQkv{P::q, P::k, P::v};
constexpr std::array<ProjectionId, 2> kGateUp{P::gate, P::up};
constexpr std::array<ProjectionId, 1> kO{P::o};
constexpr std::array<ProjectionId, 1> kDown{P::down};

// A timed group and the call sites of its all-reduces, grouped and per member.
TpComponent component(const char* chunk, std::span<const ProjectionId> members) {
  TpComponent c{chunk, {forward_site(chunk), backward_site(chunk)}};
  for (ProjectionId id : members) {
    c.sites.push_back(forward_site(kProjectionNames[int(id)]));
    c.sites.push_back(backward_site(kProjectionNames[int(id)]));
  }
  return c;
}

class VanillaLayout final : public TpLayout {
 public:
  const char* name() const override { return "vanilla"; }

  bool fits(BottleneckKind kind) const override { return kind != BottleneckKind::none; }
  const char* requirement() const override { return "needs a bottleneck model"; }
  // Only the bottleneck is split: heads, d_ff and the residual stay whole on every rank.
  void check_divisible(const ModelShape& m, int t) const override {
    require_divides(t, m.vocab, Setting::vocab_size);
    for (int i = 0; i < kNumProjections; ++i)
      if (m.rank_of(P(i)) % t != 0)
        fail_setting(Setting::tp,
                     "{} ({}) must divide the rank of the {} projection ({}) under {} = \"{}\"",
                     mention(Setting::tp), t, kProjectionNames[size_t(i)], m.rank_of(P(i)),
                     mention(Setting::tp_mode), name());
  }
  bool supports(Recompute policy, const ModelShape&) const override {
    return policy != Recompute::lowrank;
  }
  const char* why_not(Recompute) const override {
    return "the chunk boundaries are full-width and rebuilding them re-runs all-reduces";
  }

  // Every A by its r rows, every B by its r columns; the rest whole.
  ParameterSplits parameter_splits(const ModelShape&) const override {
    ParameterSplits s;
    s.embedding = 0;
    s.A.fill(0);
    s.B.fill(1);
    s.lm_head = 0;
    return s;
  }
  ModelEnds ends(const ModelShape&) const override { return {}; }
  BlockDims block_dims(const ModelShape& m, int) const override {
    BlockDims d;
    d.d = d.d_res = m.hidden;
    d.heads = m.heads;
    d.kv_heads = m.kv_heads;
    d.head_dim = m.head_dim();
    d.dq = d.heads * d.head_dim;
    d.dkv = d.kv_heads * d.head_dim;
    d.dff = m.ffn;
    return d;
  }
  // σ is elementwise, so svd and cola run their latent stage on the r/t slice; LaX's
  // crossing and LN_r need the whole latent, which each projection gathers.
  ProjectionDims projection_dims(const ModelShape& m, ProjectionId p, int t,
                                 int tp_rank) const override {
    const int64_t r = m.rank_of(p);
    const bool gathered = m.bottleneck == BottleneckKind::lax;
    ProjectionDims d;
    d.d_in = m.d_in(p);
    d.d_out = m.d_out(p);
    d.rank = gathered ? r : r / t;
    d.shard_rank = r / t;
    d.shard_offset = gathered ? r / t * tp_rank : 0;
    return d;
  }

  std::unique_ptr<TpBlock> make_block(const BlockSpec& spec,
                                      const BlockAllocators& a) const override {
    return std::make_unique<VanillaBlock>(*this, spec, a);
  }
  // The q/k/v and gate/up groups; LaX's all-gathers serve every projection alike and belong
  // to none.
  std::vector<TpComponent> components() const override {
    return {component("qkv", kQkv), component("gate_up", kGateUp)};
  }
};

VanillaBlock::VanillaBlock(const TpLayout& layout, const BlockSpec& spec, const BlockAllocators& a)
    : TpBlock(layout, spec) {
  allocate_replicated_norms(a, *this, norm1, norm2);
  allocate_buffers(a, 0);
  const int64_t n = dims.rows();
  const int64_t widest = widest_sharded_rank(*this);
  if (widest) gather = a.comm.alloc_act({2 * n * widest});
  normed_part = a.grads.alloc_act({n, dims.d_res});
  if (widest) grad_gather = a.comm.alloc_act({2 * n * widest});
}

TpTask VanillaBlock::forward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                             Tensor out) {
  VanillaBlock& b = *this;
  norm1.forward(be, x);
  const std::array<Tensor, 3> qkv_out{q, k, v};
  co_await chunks_forward(be, tp, b, prev, kQkv, norm1.out, qkv_out, qkv, "qkv", true);
  attention.forward(be, q, k, v);
  // The o projection's output before the residual add, in a buffer only backward uses.
  const Tensor o_out = grad.normed;  // [N, d]
  const std::array<Tensor, 1> o_outs{o_out};
  co_await chunks_forward(be, tp, b, prev, kO, attention_output(b), o_outs, o_out, "o", false);
  norm2.forward_residual(be, h, o_out, x);
  const std::array<Tensor, 2> gate_up_out{gate, up};
  co_await chunks_forward(be, tp, b, prev, kGateUp, norm2.out, gate_up_out, gate_up, "gate_up",
                          true);
  be.swiglu_forward(gated, gate, up, dims.gate_act);
  const std::array<Tensor, 1> o{out};
  co_await chunks_forward(be, tp, b, prev, kDown, gated, o, out, "down", false);
  be.add(out, out, h);
}

TpTask VanillaBlock::backward(Backend& be, const TensorParallel& tp, BlockLatents prev, Tensor x,
                              Tensor d_residual) {
  VanillaBlock& b = *this;
  BlockGradients& g = grad;
  const std::array<Tensor, 1> d_mlp_out{output_grad(be, tp, d_residual, kMlpOut)};
  co_await chunks_backward(be, tp, b, prev, kDown, gated, d_mlp_out, g.gated, "down", false);
  be.swiglu_backward(g.gate, g.up, g.gated, gate, up, dims.gate_act);
  const std::array<Tensor, 2> d_gate_up{g.gate, g.up};
  co_await chunks_backward(be, tp, b, prev, kGateUp, norm2.out, d_gate_up, g.normed, "gate_up",
                           true);
  norm2.backward(be, d_residual, g.normed, h);
  const std::array<Tensor, 1> d_attn_out{output_grad(be, tp, d_residual, kAttnOut)};
  co_await chunks_backward(be, tp, b, prev, kO, attention_output(b), d_attn_out, g.attn, "o",
                           false);
  attention.backward(be, g.q, g.k, g.v, g.attn, q, k, v);
  const std::array<Tensor, 3> d_qkv{g.q, g.k, g.v};
  co_await chunks_backward(be, tp, b, prev, kQkv, norm1.out, d_qkv, g.normed, "qkv", true);
  norm1.backward(be, d_residual, g.normed, x);
}

}  // namespace

const TpLayout& vanilla_tp_layout() {
  static const VanillaLayout layout;
  return layout;
}

}  // namespace bottle
