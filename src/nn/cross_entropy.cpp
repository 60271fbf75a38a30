#include "nn/cross_entropy.h"

namespace bottle {

void CrossEntropy::allocate_activations(Allocator& arena, int64_t rows, int64_t vocab) {
  losses = arena.alloc({rows});
  probs = arena.alloc({rows, vocab});
}

float CrossEntropy::forward(Backend& be, Tensor logits, Tensor targets) {
  const int64_t v = logits.cols();
  if (const int64_t i = be.first_outside(targets, 0, v); i >= 0) {
    int32_t id = 0;
    be.to_host(&id, targets.view(i, {1}));
    fail("target token id {} at position {} is outside the vocabulary [0, {})", id, i, v);
  }
  be.cross_entropy_forward(losses, probs, logits, targets);
  return float(be.sum(losses) / double(losses.numel()));
}

}  // namespace bottle
