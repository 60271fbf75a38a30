#include "parallel/vocab_parallel.h"

#include "parallel/mappings.h"

namespace bottle {

void vocab_parallel_embedding_forward(Backend& be, const TensorParallel& tp, Tensor out,
                                      Tensor tokens, Tensor table, int64_t first,
                                      std::string_view site) {
  be.embedding_shard_forward(out, tokens, table, first);
  reduce_from_forward(tp, out, site);
}

void vocab_parallel_embedding_backward(Backend& be, const TensorParallel& tp, Tensor dtable,
                                       Tensor tokens, Tensor dout, int64_t first) {
  reduce_from_backward(tp, dout);
  be.embedding_shard_backward(dtable, tokens, dout, first);
}

void VocabParallelCrossEntropy::allocate_activations(Allocator& arena, int64_t rows) {
  max = arena.alloc({rows});
  sums = arena.alloc({2, rows});
  losses = arena.alloc({rows});
}

void VocabParallelCrossEntropy::forward(Backend& be, const TensorParallel& tp, Tensor logits,
                                        Tensor targets, int64_t first, Tensor loss_sum) {
  Tensor local_sumexp = losses;  // [N] this rank's Σ exp(l - local max), until the losses
  be.logits_row_stats(max, local_sumexp, logits);
  be.copy(sumexp(), max);  // the local max, read once the max is whole
  if (tp.size() > 1) tp.comm->all_reduce(max, ReduceOp::max, "vocab.ce.max");
  be.cross_entropy_shard_partials(sumexp(), target_logit(), local_sumexp, sumexp(), max, logits,
                                  targets, first);
  if (tp.size() > 1) tp.comm->all_reduce(sums, ReduceOp::sum, "vocab.ce.sums");
  be.cross_entropy_shard_losses(losses, sumexp(), target_logit(), max);
  be.accumulate_mean(loss_sum, losses);
}

void VocabParallelCrossEntropy::backward(Backend& be, Tensor dlogits, Tensor logits, Tensor targets,
                                         int64_t first, float scale) {
  be.cross_entropy_shard_backward(dlogits, logits, max, sumexp(), targets, first, scale);
}

}  // namespace bottle
