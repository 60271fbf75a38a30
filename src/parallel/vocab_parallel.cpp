#include "parallel/vocab_parallel.h"

#include <cmath>

#include "parallel/mappings.h"

namespace bottle {

void vocab_parallel_embedding_forward(Backend& be, const TensorParallel& tp, Tensor out,
                                      Tensor tokens, Tensor table, int64_t first,
                                      std::string_view site) {
  be.embedding_shard_forward(out, tokens, table, first);
  reduce_from_forward(tp, out, site);
}

void vocab_parallel_embedding_backward(Backend& be, Tensor dtable, Tensor tokens, Tensor dout,
                                       int64_t first) {
  be.embedding_shard_backward(dtable, tokens, dout, first);
}

void VocabParallelCrossEntropy::allocate_activations(Allocator& arena, int64_t rows) {
  max = arena.alloc({rows});
  sums = arena.alloc({2, rows});
  losses = arena.alloc({rows});
}

float VocabParallelCrossEntropy::forward(Backend& be, const TensorParallel& tp, Tensor logits,
                                         Tensor targets, int64_t first) {
  const int64_t n = logits.rows(), v = logits.cols();
  float* sumexp = sums.f32();
  float* target_logit = sums.f32() + n;
  be.logits_row_stats(max, losses, logits);  // losses: this rank's Σ exp(l - local max)
  for (int64_t i = 0; i < n; ++i) sumexp[i] = max.f32()[i];
  if (tp.size() > 1) tp.comm->all_reduce(max, ReduceOp::max, "vocab.ce.max");
  for (int64_t i = 0; i < n; ++i) {
    sumexp[i] = losses.f32()[i] * std::exp(sumexp[i] - max.f32()[i]);
    const int64_t t = int64_t(targets.i32()[i]) - first;
    target_logit[i] = t >= 0 && t < v ? logits.f32()[i * v + t] : 0.0f;
  }
  if (tp.size() > 1) tp.comm->all_reduce(sums, ReduceOp::sum, "vocab.ce.sums");
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    losses.f32()[i] = std::log(sumexp[i]) + max.f32()[i] - target_logit[i];
    total += losses.f32()[i];
  }
  return float(total / double(n));
}

void VocabParallelCrossEntropy::backward(Backend& be, Tensor dlogits, Tensor logits, Tensor targets,
                                         int64_t first, float scale) {
  be.cross_entropy_shard_backward(dlogits, logits, max, sumexp(), targets, first, scale);
}

}  // namespace bottle
