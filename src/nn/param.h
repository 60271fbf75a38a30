#pragma once
// A trainable tensor and its gradient, both views into the model's parameter arenas.
#include "core/tensor.h"

namespace bottle {

struct Param {
  Tensor value;
  Tensor grad;
};

}  // namespace bottle
