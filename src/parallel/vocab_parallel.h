#pragma once
// Vocabulary-parallel embedding, LM head and cross-entropy (Megatron's
// tensor_parallel/{layers,cross_entropy}.py): rank i holds vocabulary rows
// [i·V/t, (i+1)·V/t), and no rank ever holds full-vocabulary logits.
#include "backend/backend.h"
#include "core/arena.h"
#include "parallel/tensor_parallel.h"

namespace bottle {

// out [N, d] = the embedding rows of tokens: each rank looks up the rows it holds (zeros
// elsewhere), then reduce_from sums them (N·d elements).
void vocab_parallel_embedding_forward(Backend& be, const TensorParallel& tp, Tensor out,
                                      Tensor tokens, Tensor table, int64_t first,
                                      std::string_view site);
// dtable += the rows of dout [N, d] (replicated: reduce_from's backward is the identity) that
// this rank holds; no communication.
void vocab_parallel_embedding_backward(Backend& be, const TensorParallel& tp, Tensor dtable,
                                       Tensor tokens, Tensor dout, int64_t first);

// Mean cross-entropy over logits split by vocabulary: [N, V/t] on each rank holding columns
// [first, first + V/t). Two all-reduces of per-token statistics: the max (N) and the
// sum-exp with the target's logit (2·N).
struct VocabParallelCrossEntropy {
  Tensor max;     // [N] whole-vocabulary max logit
  Tensor sums;    // [2, N] Σ exp(logit - max) and the target's logit
  Tensor losses;  // [N]

  void allocate_activations(Allocator& arena, int64_t rows);
  // Adds the mean loss (rounded to fp32) to loss_sum, f64 [1] in the backend's memory: the
  // host reads it when the step ends, not here.
  void forward(Backend& be, const TensorParallel& tp, Tensor logits, Tensor targets, int64_t first,
               Tensor loss_sum);
  // dlogits = scale · ∂(Σ losses)/∂logits, written (no communication).
  void backward(Backend& be, Tensor dlogits, Tensor logits, Tensor targets, int64_t first,
                float scale);

  Tensor sumexp() const { return sums.view(0, {max.numel()}); }                  // [N]
  Tensor target_logit() const { return sums.view(max.numel(), {max.numel()}); }  // [N]
};

}  // namespace bottle
