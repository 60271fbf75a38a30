#include "nn/cross_entropy.h"

namespace bottle {

void CrossEntropy::allocate_activations(Allocator& arena, int64_t rows, int64_t vocab) {
  losses = arena.alloc({rows});
  probs = arena.alloc({rows, vocab});
}

float CrossEntropy::forward(Backend& be, Tensor logits, Tensor targets) {
  const int64_t v = logits.cols();
  for (int64_t i = 0; i < targets.numel(); ++i)
    BOTTLE_CHECK(targets.i32()[i] >= 0 && targets.i32()[i] < v,
                 "target token id {} at position {} is outside the vocabulary [0, {})",
                 targets.i32()[i], i, v);
  be.cross_entropy_forward(losses, probs, logits, targets);
  double sum = 0.0;
  for (int64_t i = 0; i < losses.numel(); ++i) sum += losses.f32()[i];
  return float(sum / double(losses.numel()));
}

}  // namespace bottle
