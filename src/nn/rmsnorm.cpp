#include "nn/rmsnorm.h"

namespace bottle {

void RMSNorm::allocate_activations(Allocator& arena, int64_t rows, int64_t cols) {
  out = arena.alloc_act({rows, cols});
  rstd = arena.alloc({rows});
}

}  // namespace bottle
