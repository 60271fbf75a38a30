#pragma once
// Megatron's conjugate pairs (megatron/core/tensor_parallel/mappings.py), the reference
// path every tensor-parallel layer goes through:
//   copy_to      forward identity,   backward all-reduce   (in front of a column-split layer)
//   reduce_from  forward all-reduce, backward identity     (after a row-split layer)
//   gather       forward all-gather along the last dim, backward scatter (keep own slice)
//   scatter      forward keep own slice,                   backward all-gather
// Only the halves that communicate are functions; the identities are written as comments
// where they apply. A group of one rank communicates nothing.
#include <string_view>

#include "core/backend.h"
#include "parallel/tensor_parallel.h"

namespace bottle {

// Backward of copy_to: dx [N, C] partial sums on each rank → the sum, in place.
void copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site);
// Forward of reduce_from: y [N, C] partial sums → the sum, in place.
void reduce_from_forward(const TensorParallel& tp, Tensor y, std::string_view site);
// gather: out [N, C·t] = the ranks' in [N, C] side by side; scratch holds t·N·C elements.
void gather_last_dim(Backend& be, const TensorParallel& tp, Tensor out, Tensor in, Tensor scratch,
                     std::string_view site);
// scatter: out [N, C] = this rank's columns [rank·C, (rank+1)·C) of in [N, C·t] (no comm).
void scatter_last_dim(Backend& be, const TensorParallel& tp, Tensor out, Tensor in);

}  // namespace bottle
