#pragma once
// Megatron's conjugate pairs (megatron/core/tensor_parallel/mappings.py), the reference
// path every tensor-parallel layer goes through. Each mapping has both halves, so a call in
// one pass names the partner the other pass runs:
//   copy_to      forward identity,                 backward all-reduce
//                (in front of a layer split by its outputs)
//   reduce_from  forward all-reduce,               backward identity
//                (after a layer split by its inputs)
//   gather       forward all-gather along the last dim, backward keep own slice
//   scatter      forward keep own slice,           backward all-gather along the last dim
// The identity halves do nothing: they are called where they apply so that every
// communicating half has its partner written in the other pass. A group of one rank
// communicates nothing.
//
// A block's passes are coroutines (tp_overlap.h) and co_await the communicating halves' twins
// (co_copy_to_backward, ...): blocking where the pass runs serially, started and suspending the
// pass where TP overlap runs it as one of two halves. The model's ends (embedding, final
// gather, LM head, loss) run outside the halves and call the blocking ones.
#include <string_view>

#include "backend/backend.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_overlap.h"

namespace bottle {

// Forward of copy_to: x [N, C], whole on every rank, enters a layer split by its outputs
// unchanged. Its backward, copy_to_backward, sums the input gradient over the ranks.
inline void copy_to_forward(const TensorParallel&, Tensor) {}
// Backward of copy_to: dx [N, C] partial sums on each rank → the sum, in place.
void copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site);

CollectiveAwaiter co_copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site);
// The same, around the layer's weight gradient (`weight_grad()`, which must not touch dx): dx's
// sum travels while it runs (TpBackward::async, Megatron's order), or starts after it
// (TpBackward::serial). dx is the input gradient just computed.
// Where the weight gradients are queued for a W pass (tp.weight_grads), the sum runs alone.
template <typename WeightGrad>
TpTask co_copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site,
                           WeightGrad weight_grad) {
  if (tp.backward == TpBackward::serial || tp.weight_grads) {
    tp.weight_grad(std::move(weight_grad));
    co_await co_copy_to_backward(tp, dx, site);
    co_return;
  }
  CollectiveAwaiter summed = tp_start_all_reduce(tp, dx, site);
  weight_grad();
  co_await summed;
}

// Forward of reduce_from: y [N, C] partial sums → the sum, in place.
void reduce_from_forward(const TensorParallel& tp, Tensor y, std::string_view site);
CollectiveAwaiter co_reduce_from_forward(const TensorParallel& tp, Tensor y, std::string_view site);
// Backward of reduce_from: dy [N, C] is whole on every rank, and so is the gradient of each
// rank's partial sum; nothing to do.
inline void reduce_from_backward(const TensorParallel&, Tensor) {}

// Forward of gather: out [N, C·t] = the ranks' in [N, C] side by side; scratch holds t·N·C
// elements.
void gather_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                             Tensor scratch, std::string_view site);
TpTask co_gather_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                                  Tensor scratch, std::string_view site);
// Backward of gather: dx [N, C] = this rank's columns [rank·C, (rank+1)·C) of dy [N, C·t]
// (no communication).
void gather_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy);

// Forward of scatter: out [N, C] = this rank's columns [rank·C, (rank+1)·C) of in [N, C·t]
// (no communication).
void scatter_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in);
// Backward of scatter: dx [N, C·t] = the ranks' dy [N, C] side by side; scratch holds t·N·C
// elements.
void scatter_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy,
                               Tensor scratch, std::string_view site);
TpTask co_scatter_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy,
                                    Tensor scratch, std::string_view site);

}  // namespace bottle
