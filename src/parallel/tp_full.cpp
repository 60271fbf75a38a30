// `full`: Megatron TP on a full-rank model. Wq, Wk, Wv, Wgate, Wup split by columns (heads,
// d_ff), Wo and Wdown by rows; the block input is replicated.
// Per block and pass, per token:  forward 2·d (reduce_from after Wo and after Wdown),
// backward 2·d (copy_to in front of q/k/v and in front of gate/up). 2 collectives each way.
#include "parallel/mappings.h"
#include "parallel/tp_block.h"

namespace bottle {

void full_block_forward(Backend& be, const TensorParallel& tp, TpBlock& b, Tensor x, Tensor out) {
  using P = ProjectionId;
  b.norm1.forward(be, x);
  // copy_to(n1): forward identity.
  b[P::q].forward(be, b.q, b.norm1.out, {});
  b[P::k].forward(be, b.k, b.norm1.out, {});
  b[P::v].forward(be, b.v, b.norm1.out, {});
  b.attention.forward(be, b.q, b.k, b.v);
  b[P::o].forward(be, b.h, attention_output(b), {});
  reduce_from_forward(tp, b.h, "full.fwd.attn_out");  // N·d
  be.add(b.h, b.h, x);
  b.norm2.forward(be, b.h);
  b[P::gate].forward(be, b.gate, b.norm2.out, {});
  b[P::up].forward(be, b.up, b.norm2.out, {});
  be.swiglu_forward(b.gated, b.gate, b.up, b.dims.gate_act);
  b[P::down].forward(be, out, b.gated, {});
  reduce_from_forward(tp, out, "full.fwd.mlp_out");  // N·d
  be.add(out, out, b.h);
}

void full_block_backward(Backend& be, const TensorParallel& tp, TpBlock& b, Tensor x,
                         BlockGradients& g) {
  using P = ProjectionId;
  // reduce_from's backward is the identity: g.residual is whole on every rank.
  b[P::down].backward(be, g.gated, g.residual, b.gated, {}, {}, false);
  be.fill_zero(g.gate_up);
  be.swiglu_backward(g.gate, g.up, g.gated, b.gate, b.up, b.dims.gate_act);
  b[P::gate].backward(be, g.normed, g.gate, b.norm2.out, {}, {}, false);
  b[P::up].backward(be, g.normed, g.up, b.norm2.out, {}, {});
  copy_to_backward(tp, g.normed, "full.bwd.mlp_in");  // N·d
  b.norm2.backward(be, g.residual, g.normed, b.h);
  b[P::o].backward(be, g.attn, g.residual, attention_output(b), {}, {}, false);
  be.fill_zero(g.qkv);
  b.attention.backward(be, g.q, g.k, g.v, g.attn, b.q, b.k, b.v);
  b[P::q].backward(be, g.normed, g.q, b.norm1.out, {}, {}, false);
  b[P::k].backward(be, g.normed, g.k, b.norm1.out, {}, {});
  b[P::v].backward(be, g.normed, g.v, b.norm1.out, {}, {});
  copy_to_backward(tp, g.normed, "full.bwd.attn_in");  // N·d
  b.norm1.backward(be, g.residual, g.normed, x);
}

}  // namespace bottle
