#pragma once
// RMSNorm(x) = x / sqrt(mean(x²) + eps) ⊙ γ over the last dim.
#include "core/arena.h"
#include "backend/backend.h"
#include "nn/param.h"

namespace bottle {

struct RMSNorm {
  Param weight;  // γ [C]
  float eps{};   // model.rms_norm_eps: whoever binds the weight sets it (no second default)
  Tensor out;    // [N, C]
  Tensor rstd;   // [N]

  void allocate_activations(Allocator& arena, int64_t rows, int64_t cols);
  void forward(Backend& be, Tensor x) { be.rmsnorm_forward(out, rstd, x, weight.value, eps); }
  // sum = x + residual, then the norm of sum, in one pass (the residual add before a block's
  // second norm). backward() then takes sum as its x.
  void forward_residual(Backend& be, Tensor sum, Tensor x, Tensor residual) {
    be.residual_rmsnorm_forward(sum, out, rstd, x, residual, weight.value, eps);
  }
  // dx += ∂/∂x; dγ +=.
  void backward(Backend& be, Tensor dx, Tensor dout, Tensor x) {
    be.rmsnorm_backward(dx, weight.grad, dout, x, weight.value, rstd);
  }
};

}  // namespace bottle
