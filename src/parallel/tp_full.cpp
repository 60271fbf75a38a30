// `full`: Megatron TP on a full-rank model. Wq, Wk, Wv, Wgate, Wup split by columns (heads,
// d_ff), Wo and Wdown by rows; the block input is replicated.
// Per block and pass, per token:  forward 2·d (reduce_from after Wo and after Wdown),
// backward 2·d (copy_to in front of q/k/v and in front of gate/up). 2 collectives each way.
// Embedding and LM head: both split by vocabulary rows; the embedding's rows are summed by one
// all-reduce of N·d, and the residual reaches the final norm whole.
#include <array>
#include <span>
#include <string_view>
#include <vector>

#include "nn/linear.h"
#include "nn/rmsnorm.h"
#include "parallel/mappings.h"
#include "parallel/tp_layout.h"

namespace bottle {
namespace {

using P = ProjectionId;

// Split by their inputs (rows of W's input side): the second of each pair of Megatron layers.
bool row_parallel(ProjectionId p) { return p == P::o || p == P::down; }

constexpr std::array<ProjectionId, 3> kQkv{P::q, P::k, P::v};
constexpr std::array<ProjectionId, 2> kGateUp{P::gate, P::up};

std::vector<Tensor> weights(const TpBlock& b, std::span<const ProjectionId> ids,
                            Tensor Param::*field) {
  std::vector<Tensor> out;
  for (ProjectionId id : ids) out.push_back(b[id].weight.*field);
  return out;
}

// ys[i] = x W_iᵀ for projections that read one input. Grouping runs them as batched GEMMs
// where their widths agree (their weights are declared side by side: design §6); without it
// each runs its own.
void shared_input_forward(Backend& be, const TensorParallel& tp, TpBlock& b,
                          std::span<const ProjectionId> ids, std::span<const Tensor> ys, Tensor x) {
  if (!tp.grouping) {
    for (size_t i = 0; i < ids.size(); ++i) b[ids[i]].forward(be, ys[i], x, {});
    return;
  }
  linear_forward_shared_input(be, ys, x, weights(b, ids, &Param::compute));
}

// The two halves of the backward of projections that read one input, for copy_to's backward
// to run between them. dx = Σ dy_i W_i (written: the first member's GEMM has beta 0).
void shared_input_grad(Backend& be, const TensorParallel& tp, TpBlock& b,
                       std::span<const ProjectionId> ids, Tensor dx, std::span<const Tensor> dys) {
  if (!tp.grouping) {
    for (size_t i = 0; i < ids.size(); ++i)
      linear_input_grad(be, dx, dys[i], b[ids[i]].weight.compute, /*accumulate_dx=*/i > 0);
    return;
  }
  linear_input_grad_shared_input(be, dx, dys, weights(b, ids, &Param::compute));
}

// dW_i += dy_iᵀ x: batched where grouping batches the forward.
void shared_weight_grad(Backend& be, bool grouping, TpBlock& b, std::span<const ProjectionId> ids,
                        std::span<const Tensor> dys, Tensor x) {
  if (!grouping) {
    for (size_t i = 0; i < ids.size(); ++i)
      linear_weight_grad(be, b[ids[i]].weight.grad, dys[i], x);
    return;
  }
  linear_weight_grad_shared_input(be, weights(b, ids, &Param::grad), dys, x);
}

// dx = Σ dy_i W_i summed over the ranks (copy_to's backward: the layers are split by their
// outputs), the weight gradients computed while the sum travels (TpBackward) or queued for the
// W pass. `ids` are static (kQkv, kGateUp); the weight gradient owns a copy of dys.
TpTask shared_input_backward(Backend& be, const TensorParallel& tp, TpBlock& b,
                             std::span<const ProjectionId> ids, Tensor dx,
                             std::span<const Tensor> dys, Tensor x, std::string_view site) {
  shared_input_grad(be, tp, b, ids, dx, dys);
  // Named, not a temporary of the co_await expression: g++ 12 destroys such a lambda's
  // captures twice.
  auto weight_grad = [&be, grouping = tp.grouping, &b, ids,
                      d = std::vector<Tensor>(dys.begin(), dys.end()),
                      x] { shared_weight_grad(be, grouping, b, ids, d, x); };
  co_await co_copy_to_backward(tp, dx, site, std::move(weight_grad));
}

// A row-parallel projection's backward (o, down: no collective, reduce_from's backward is the
// identity): dx = dy W, and dW += dyᵀ x now or in the W pass.
void row_parallel_backward(Backend& be, const TensorParallel& tp, Projection& p, Tensor dx,
                           Tensor dy, Tensor x) {
  linear_input_grad(be, dx, dy, p.weight.compute, /*accumulate_dx=*/false);
  tp.weight_grad([&be, &p, dy, x] { linear_weight_grad(be, p.weight.grad, dy, x); });
}

class FullLayout final : public TpLayout {
 public:
  const char* name() const override { return "full"; }

  bool fits(BottleneckKind kind) const override { return kind == BottleneckKind::none; }
  const char* requirement() const override { return "is for a full-rank model"; }
  void check_divisible(const ModelShape& m, int t) const override {
    check_head_split_divisible(m, t);
  }
  bool supports(Recompute policy, const ModelShape&) const override {
    return policy != Recompute::lowrank;
  }
  const char* why_not(Recompute) const override {
    return "the chunk boundaries are full-width and rebuilding them re-runs all-reduces";
  }

  ParameterSplits parameter_splits(const ModelShape&) const override {
    ParameterSplits s;
    s.embedding = 0;
    for (int i = 0; i < kNumProjections; ++i) s.weight[size_t(i)] = row_parallel(P(i)) ? 1 : 0;
    s.lm_head = 0;
    return s;
  }
  ModelEnds ends(const ModelShape&) const override { return {}; }
  BlockDims block_dims(const ModelShape& m, int t) const override {
    return head_split_dims(m, t, /*d_res=*/m.hidden);
  }
  ProjectionDims projection_dims(const ModelShape& m, ProjectionId p, int t, int) const override {
    ProjectionDims d;
    d.d_in = row_parallel(p) ? m.d_in(p) / t : m.d_in(p);
    d.d_out = row_parallel(p) ? m.d_out(p) : m.d_out(p) / t;
    return d;
  }

  std::unique_ptr<TpBlock> make_block(const BlockSpec& spec,
                                      const BlockAllocators& a) const override;
};

// The block: every projection's weight split by heads or d_ff, the norms replicated.
class FullBlock final : public TpBlock {
 public:
  FullBlock(const TpLayout& layout, const BlockSpec& spec, const BlockAllocators& a)
      : TpBlock(layout, spec) {
    allocate_replicated_norms(a, *this, norm1, norm2);
    allocate_buffers(a, 0);
  }

  TpTask forward(Backend& be, const TensorParallel& tp, BlockLatents, Tensor x,
                 Tensor out) override {
    TpBlock& b = *this;
    norm1.forward(be, x);
    copy_to_forward(tp, norm1.out);
    shared_input_forward(be, tp, b, kQkv, std::array{q, k, v}, norm1.out);
    attention.forward(be, q, k, v);
    // The o projection's output before the residual add, in a buffer only backward uses.
    const Tensor o_out = grad.normed;  // [N, d]
    b[P::o].forward(be, o_out, attention_output(b), {});
    co_await co_reduce_from_forward(tp, o_out, "full.fwd.attn_out");  // N·d
    norm2.forward_residual(be, h, o_out, x);
    copy_to_forward(tp, norm2.out);
    shared_input_forward(be, tp, b, kGateUp, std::array{gate, up}, norm2.out);
    be.swiglu_forward(gated, gate, up, dims.gate_act);
    if (tp.size() == 1) {  // the all-reduce is the identity: the residual add is the GEMM's
      b[P::down].forward(be, out, gated, {}, h);
      co_return;
    }
    b[P::down].forward(be, out, gated, {});
    co_await co_reduce_from_forward(tp, out, "full.fwd.mlp_out");  // N·d
    be.add(out, out, h);
  }

  TpTask backward(Backend& be, const TensorParallel& tp, BlockLatents, Tensor x,
                  Tensor d_residual) override {
    TpBlock& b = *this;
    BlockGradients& g = grad;
    // d_residual is whole on every rank.
    reduce_from_backward(tp, d_residual);  // of mlp_out
    row_parallel_backward(be, tp, b[P::down], g.gated, output_grad(be, tp, d_residual, kMlpOut),
                          gated);
    be.swiglu_backward(g.gate, g.up, g.gated, gate, up, dims.gate_act);
    const std::array<Tensor, 2> d_gate_up{g.gate, g.up};
    co_await shared_input_backward(be, tp, b, kGateUp, g.normed, d_gate_up, norm2.out,
                                   "full.bwd.mlp_in");  // N·d
    norm2.backward(be, d_residual, g.normed, h);
    reduce_from_backward(tp, d_residual);  // of attn_out
    row_parallel_backward(be, tp, b[P::o], g.attn, output_grad(be, tp, d_residual, kAttnOut),
                          attention_output(b));
    attention.backward(be, g.q, g.k, g.v, g.attn, q, k, v);
    const std::array<Tensor, 3> d_qkv{g.q, g.k, g.v};
    co_await shared_input_backward(be, tp, b, kQkv, g.normed, d_qkv, norm1.out,
                                   "full.bwd.attn_in");  // N·d
    norm1.backward(be, d_residual, g.normed, x);
  }

 private:
  RMSNorm norm1, norm2;  // whole rows, replicated
};

std::unique_ptr<TpBlock> FullLayout::make_block(const BlockSpec& spec,
                                                const BlockAllocators& a) const {
  return std::make_unique<FullBlock>(*this, spec, a);
}

}  // namespace

const TpLayout& full_tp_layout() {
  static const FullLayout layout;
  return layout;
}

}  // namespace bottle
