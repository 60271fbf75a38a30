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
#include "parallel/component_times.h"
#include "parallel/mappings.h"
#include "parallel/projection_group.h"
#include "parallel/tp_block.h"

namespace bottle {
namespace {

using P = ProjectionId;

struct Chunk {
  std::array<Projection*, 3> members;
  size_t size;
  ProjectionSpan span() const { return {members.data(), size}; }
};

// The latent stage of each member, after gathering LaX's sharded latents.
void latents_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev,
                     ProjectionSpan group, std::span<const ProjectionId> ids,
                     const char* component) {
  for (size_t i = 0; i < group.size(); ++i) {
    Projection& p = *group[i];
    if (p.sharded()) gather_last_dim(be, tp, p.z, p.z_shard, b.gather, "vanilla.fwd.lax_gather");
    const ComponentTimer timer(tp, component);
    p.latent_forward(be, prev_latent(prev, b, ids[i]));
  }
}

void latents_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev,
                      BlockGradients& g, ProjectionSpan group, std::span<const ProjectionId> ids,
                      const char* component) {
  for (size_t i = 0; i < group.size(); ++i) {
    Projection& p = *group[i];
    Tensor whole;
    if (p.sharded()) {
      const int64_t n = p.du.rows();
      whole = g.gather.view(n * p.rank, {n, p.rank});  // after the gather's own scratch
      gather_last_dim(be, tp, whole, p.du_shard, g.gather, "vanilla.bwd.lax_gather");
    }
    const ComponentTimer timer(tp, component);
    if (p.sharded()) be.accumulate(p.du, whole);
    p.latent_backward(be, prev_latent(prev, b, ids[i]), prev_latent_grad(prev, b, ids[i]));
  }
}

// outputs_p = chunk_p(x), then reduce_from: one all-reduce over the contiguous outputs
// with grouping, else one per projection.
void chunks_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev,
                    std::span<const ProjectionId> ids, Tensor x, std::span<const Tensor> outputs,
                    Tensor outputs_slab, const char* group_site, const char* component) {
  std::array<Projection*, 3> members{};
  for (size_t i = 0; i < ids.size(); ++i) members[i] = &b[ids[i]];
  const ProjectionSpan group{members.data(), ids.size()};
  // copy_to(x): forward identity.
  {
    const ComponentTimer timer(tp, component);
    group_down_forward(be, group, x, tp.grouping);
  }
  latents_forward(be, tp, b, prev, group, ids, component);
  {
    const ComponentTimer timer(tp, component);
    group_up_forward(be, group, outputs, tp.grouping);
  }
  if (tp.grouping) {
    reduce_from_forward(tp, outputs_slab, group_site);
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i)
    reduce_from_forward(tp, outputs[i],
                        fmt::format("vanilla.fwd.{}_out", kProjectionNames[int(ids[i])]));
}

// dx = Σ_p ∂/∂x of chunk_p given dys; copy_to's backward all-reduces the input gradient:
// once for the sum with grouping, else once per projection.
void chunks_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev,
                     BlockGradients& g, std::span<const ProjectionId> ids, Tensor x,
                     std::span<const Tensor> dys, Tensor dx, const char* group_site,
                     const char* component) {
  std::array<Projection*, 3> members{};
  std::array<Tensor, 3> du_out{};
  for (size_t i = 0; i < ids.size(); ++i) {
    members[i] = &b[ids[i]];
    du_out[i] = members[i]->sharded() ? members[i]->du_shard : members[i]->du;
  }
  const ProjectionSpan group{members.data(), ids.size()};
  // reduce_from's backward is the identity: dys are whole on every rank. A whole du may
  // hold the next block's crossing share already: B's product adds to it.
  const bool sharded = members[0]->sharded();
  {
    const ComponentTimer timer(tp, component);
    group_up_backward(be, group, dys, {du_out.data(), ids.size()}, !sharded, tp.grouping);
  }
  latents_backward(be, tp, b, prev, g, group, ids, component);
  if (tp.grouping) {
    {
      const ComponentTimer timer(tp, component);
      group_down_backward(be, group, dx, x, false, true);
    }
    copy_to_backward(tp, dx, group_site);
    return;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    Tensor part = i == 0 ? dx : Tensor{g.normed_part.data, dx.shape};
    {
      const ComponentTimer timer(tp, component);
      group_down_backward(be, group.subspan(i, 1), part, x, false, false);
    }
    copy_to_backward(tp, part, fmt::format("vanilla.bwd.{}_in", kProjectionNames[int(ids[i])]));
    if (i > 0) {
      const ComponentTimer timer(tp, component);
      be.accumulate(dx, part);
    }
  }
}

constexpr std::array<ProjectionId, 3> kQkv{P::q, P::k, P::v};
constexpr std::array<ProjectionId, 2> kGateUp{P::gate, P::up};
constexpr std::array<ProjectionId, 1> kO{P::o};
constexpr std::array<ProjectionId, 1> kDown{P::down};

}  // namespace

void vanilla_block_forward(Backend& be, const TensorParallel& tp, TpBlock& b, const TpBlock* prev,
                           Tensor x, Tensor out) {
  b.norm1.forward(be, x);
  const std::array<Tensor, 3> qkv{b.q, b.k, b.v};
  chunks_forward(be, tp, b, prev, kQkv, b.norm1.out, qkv, b.qkv, "vanilla.fwd.qkv_out", "qkv");
  b.attention.forward(be, b.q, b.k, b.v);
  const std::array<Tensor, 1> h{b.h};
  chunks_forward(be, tp, b, prev, kO, attention_output(b), h, b.h, "vanilla.fwd.o_out", nullptr);
  be.add(b.h, b.h, x);
  b.norm2.forward(be, b.h);
  const std::array<Tensor, 2> gate_up{b.gate, b.up};
  chunks_forward(be, tp, b, prev, kGateUp, b.norm2.out, gate_up, b.gate_up,
                 "vanilla.fwd.gate_up_out", "gate_up");
  be.swiglu_forward(b.gated, b.gate, b.up, b.dims.gate_act);
  const std::array<Tensor, 1> o{out};
  chunks_forward(be, tp, b, prev, kDown, b.gated, o, out, "vanilla.fwd.down_out", nullptr);
  be.add(out, out, b.h);
}

void vanilla_block_backward(Backend& be, const TensorParallel& tp, TpBlock& b, TpBlock* prev,
                            Tensor x, BlockGradients& g) {
  const std::array<Tensor, 1> d_out{g.residual};
  chunks_backward(be, tp, b, prev, g, kDown, b.gated, d_out, g.gated, "vanilla.bwd.down_in",
                  nullptr);
  be.fill_zero(g.gate_up);
  be.swiglu_backward(g.gate, g.up, g.gated, b.gate, b.up, b.dims.gate_act);
  const std::array<Tensor, 2> d_gate_up{g.gate, g.up};
  chunks_backward(be, tp, b, prev, g, kGateUp, b.norm2.out, d_gate_up, g.normed,
                  "vanilla.bwd.gate_up_in", "gate_up");
  b.norm2.backward(be, g.residual, g.normed, b.h);
  chunks_backward(be, tp, b, prev, g, kO, attention_output(b), d_out, g.attn, "vanilla.bwd.o_in",
                  nullptr);
  be.fill_zero(g.qkv);
  b.attention.backward(be, g.q, g.k, g.v, g.attn, b.q, b.k, b.v);
  const std::array<Tensor, 3> d_qkv{g.q, g.k, g.v};
  chunks_backward(be, tp, b, prev, g, kQkv, b.norm1.out, d_qkv, g.normed, "vanilla.bwd.qkv_in",
                  "qkv");
  b.norm1.backward(be, g.residual, g.normed, x);
}

}  // namespace bottle
