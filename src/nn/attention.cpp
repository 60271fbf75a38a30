#include "nn/attention.h"

namespace bottle {
namespace {
Tensor reshaped(Tensor t, Shape shape) {
  BOTTLE_ASSERT(t.numel() == shape.numel(), "attention: cannot view {} as {}", t.shape.str(),
                shape.str());
  t.shape = shape;
  return t;
}
}  // namespace

void Attention::allocate_activations(Allocator& arena) {
  out = arena.alloc_act(q_shape());
  lse = arena.alloc({batch, heads, seq});
}

void Attention::forward(Backend& be, Tensor q, Tensor k, Tensor v) {
  q = reshaped(q, q_shape());
  k = reshaped(k, kv_shape());
  v = reshaped(v, kv_shape());
  be.rope_forward(q, k, rope_theta);
  be.attention_forward(out, lse, q, k, v);
}

void Attention::backward(Backend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q,
                         Tensor k, Tensor v) {
  dq = reshaped(dq, q_shape());
  dk = reshaped(dk, kv_shape());
  be.attention_backward(dq, dk, reshaped(dv, kv_shape()), reshaped(dout, q_shape()), out, lse,
                        reshaped(q, q_shape()), reshaped(k, kv_shape()), reshaped(v, kv_shape()));
  be.rope_backward(dq, dk, rope_theta);
}

}  // namespace bottle
