#pragma once
// A trainable tensor and its gradient, both views into the model's parameter arenas, and
// the copy of it that GEMMs read.
#include "core/tensor.h"

namespace bottle {

struct Param {
  Tensor value;    // the fp32 master weights the optimizer updates
  Tensor grad;     // fp32, accumulated (+=)
  Tensor compute;  // what GEMMs read: `value` itself, or its bf16 copy under mixed precision

  Param() = default;
  Param(Tensor value, Tensor grad, Tensor compute) : value(value), grad(grad), compute(compute) {}
  // fp32 throughout: GEMMs read the values themselves.
  Param(Tensor value, Tensor grad) : Param(value, grad, value) {}
};

}  // namespace bottle
