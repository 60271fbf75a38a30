#pragma once
// Full-rank linear map y = x · Wᵀ with W stored [out, in] (the HF / PyTorch layout).
#include "core/backend.h"

namespace bottle {

// y[N,out] = x[N,in] · Wᵀ; adds into y instead when `accumulate` (residual branches).
void linear_forward(Backend& be, Tensor y, Tensor x, Tensor w, bool accumulate = false);
// dx[N,in] += dy[N,out] · W (= when !accumulate_dx: saves zeroing a fresh buffer; skipped
// when dx is empty); dW[out,in] += dyᵀ · x.
void linear_backward(Backend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w,
                     bool accumulate_dx = true);

}  // namespace bottle
