#pragma once
// Full-rank linear map y = x · Wᵀ with W stored [out, in] (the HF / PyTorch layout).
#include <span>
#include <vector>

#include "backend/backend.h"

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
// The two halves of linear_backward, for a backward that runs something between them (the
// tensor-parallel backward starts dx's all-reduce before the weight gradient: Megatron's
// order). The same GEMMs, so the same bits, in either order.
// dx[N,in] (+)= dy[N,out] · W.
void linear_input_grad(Backend& be, Tensor dx, Tensor dy, Tensor w, bool accumulate_dx = true);
// dW[out,in] += dyᵀ · x.
void linear_weight_grad(Backend& be, Tensor dw, Tensor dy, Tensor x);

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

// Full-rank projections that read one input (q, k, v; gate, up): y_p[N,out_p] = x · W_pᵀ and
// its backward, each run of members with equal widths as one batched GEMM with x broadcast
// (batch stride 0) where their weights and outputs are equally spaced (declared and allocated
// side by side). x's gradient is a sum over the members, so it stays one GEMM per member:
// the first writes dx (written, not accumulated: design §11), the rest add. The products are the
// members' own, computed alike: batching changes the number of launches, not what each sums.
void linear_forward_shared_input(Backend& be, std::span<const Tensor> ys, Tensor x,
                                 std::span<const Tensor> ws);
void linear_backward_shared_input(Backend& be, Tensor dx, std::span<const Tensor> dws,
                                  std::span<const Tensor> dys, Tensor x,
                                  std::span<const Tensor> ws);
// Its halves: dx = Σ_p dy_p · W_p; dW_p += dy_pᵀ · x (batched as above).
void linear_input_grad_shared_input(Backend& be, Tensor dx, std::span<const Tensor> dys,
                                    std::span<const Tensor> ws);
void linear_weight_grad_shared_input(Backend& be, std::span<const Tensor> dws,
                                     std::span<const Tensor> dys, Tensor x);

}  // namespace bottle
