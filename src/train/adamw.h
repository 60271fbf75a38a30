#pragma once
// AdamW with decoupled weight decay (none on parameters declared without it: norms and
// embeddings by default). Moments live in the optimizer arena, laid out like the flat
// parameter buffer.
#include <memory>

#include "core/arena.h"
#include "core/backend.h"
#include "model/parameters.h"

namespace bottle {

struct AdamWConfig {
  float lr = 3e-4f;
  float beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f;
  float weight_decay = 0.1f;
};

class AdamW {
 public:
  AdamW(const ParameterStore& params, const AdamWConfig& config);

  // One update of every parameter with learning rate `lr`; each gradient is multiplied by
  // `grad_scale` first (gradient clipping).
  void step(Backend& be, const ParameterStore& params, float lr, float grad_scale = 1.0f);

  int64_t steps_taken() const { return step_; }
  Tensor first_moment() const { return m_; }
  Tensor second_moment() const { return v_; }
  void set_steps_taken(int64_t step) { step_ = step; }

 private:
  AdamWConfig config_;
  Arena arena_{MemoryTag::optimizer};
  Tensor m_, v_;  // [count] each
  int64_t step_ = 0;
};

}  // namespace bottle
