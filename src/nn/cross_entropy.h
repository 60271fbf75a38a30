#pragma once
// Mean token cross-entropy over N rows of logits.
#include "core/arena.h"
#include "backend/backend.h"

namespace bottle {

struct CrossEntropy {
  Tensor losses;  // [N] per-token loss
  Tensor probs;   // [N, V] softmax, kept for backward

  void allocate_activations(Allocator& arena, int64_t rows, int64_t vocab);
  // Returns the mean loss over the N rows.
  float forward(Backend& be, Tensor logits, Tensor targets);
  // dlogits = scale · ∂(sum of losses)/∂logits; scale = 1/N gives the mean's gradient.
  void backward(Backend& be, Tensor dlogits, Tensor targets, float scale) {
    be.cross_entropy_backward(dlogits, probs, targets, scale);
  }
};

}  // namespace bottle
