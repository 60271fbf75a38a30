#pragma once
// Token embedding: out[n,:] = table[token[n],:].
#include "backend/backend.h"
#include "nn/param.h"

namespace bottle {

struct Embedding {
  Param table;  // [V, d]
  void forward(Backend& be, Tensor out, Tensor tokens) {
    be.embedding_forward(out, tokens, table.value);
  }
  void backward(Backend& be, Tensor dout, Tensor tokens) {
    be.embedding_backward(table.grad, tokens, dout);
  }
};

}  // namespace bottle
