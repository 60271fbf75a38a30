#pragma once
// Causal self-attention core with RoPE and GQA: out = softmax(rope(q) rope(k)ᵀ/√hd) v per
// head. The q/k/v/o projections live in the block; this is the part between them.
#include "core/arena.h"
#include "backend/backend.h"

namespace bottle {

struct Attention {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float rope_theta{};  // model.rope_theta: whoever builds the block sets it
  Tensor out;          // [B, S, H, hd]
  Tensor lse;          // [B, H, S] log-sum-exp of each query's scores, for backward

  void allocate_activations(Allocator& arena);
  Shape q_shape() const { return {batch, seq, heads, head_dim}; }
  Shape kv_shape() const { return {batch, seq, kv_heads, head_dim}; }

  // Rotates q and k in place (they are kept rotated for backward), then attends.
  void forward(Backend& be, Tensor q, Tensor k, Tensor v);
  // dq, dk, dv = ∂/∂(q, k, v before RoPE), written: the attention kernel writes them, then
  // RoPE's backward rotates dq and dk in place.
  void backward(Backend& be, Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor q, Tensor k,
                Tensor v);
};

}  // namespace bottle
