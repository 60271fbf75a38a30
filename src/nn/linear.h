#pragma once
// Full-rank linear map y = x · Wᵀ with W stored [out, in] (the HF / PyTorch layout).
#include <vector>

#include "core/backend.h"

namespace bottle {

// y[N,out] = x[N,in] · Wᵀ + residual[N,out] when a residual is given (the GEMM's C input:
// it may be y itself, and is added in the GEMM's epilogue, rounded once with the product).
void linear_forward(Backend& be, Tensor y, Tensor x, Tensor w, Tensor residual = {});
// Makes g's C input the residual (beta 1), checked to be laid out like y; nothing when empty.
void add_residual(GemmArgs& g, Tensor residual, Tensor y);

// dx[N,in] += dy[N,out] · W (= when !accumulate_dx: saves zeroing a fresh buffer; skipped
// when dx is empty); dW[out,in] += dyᵀ · x.
void linear_backward(Backend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w,
                     bool accumulate_dx = true);

// One GEMM shape applied to several operand triples (grouped projections: A_q, A_k, A_v
// reading one input; B_k, B_v; ...). `shape` gives trans, m, n, k, alpha, beta and the
// leading dimensions; each item its a, b, c. Runs of items whose pointers are equally
// spaced (a zero spacing broadcasts one operand) and whose outputs are disjoint (whole
// matrices one after another, or column blocks side by side in rows of ldc) go to the
// backend as one batched GEMM.
struct GemmOperands {
  const void* a;
  const void* b;
  void* c;
};
void gemm_grouped(Backend& be, GemmArgs shape, const std::vector<GemmOperands>& items);

}  // namespace bottle
