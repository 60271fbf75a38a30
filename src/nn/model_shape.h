#pragma once
// The shapes of a LLaMA model, as plain numbers: what a tensor-parallel layout needs to know
// about the model it splits (parallel/tp_layout.h). src/model builds it from its ModelConfig
// (ModelConfig::shape), whose d_in and d_out are these.
#include <array>
#include <cstdint>

#include "nn/projection.h"

namespace bottle {

struct ModelShape {
  int64_t vocab = 0;     // V
  int64_t hidden = 0;    // d
  int64_t ffn = 0;       // d_ff
  int64_t heads = 0;     // H
  int64_t kv_heads = 0;  // H_kv
  BottleneckKind bottleneck = BottleneckKind::none;
  std::array<int64_t, kNumProjections> ranks{};  // r of each projection (bottleneck models)
  bool tied_embeddings = false;                  // one table for the embedding and the LM head

  bool low_rank() const { return bottleneck != BottleneckKind::none; }
  int64_t head_dim() const { return hidden / heads; }
  int64_t rank_of(ProjectionId p) const { return ranks[size_t(p)]; }
  // W: d_in → d_out of each projection.
  int64_t d_in(ProjectionId p) const {
    switch (p) {
      case ProjectionId::o:
        return heads * head_dim();
      case ProjectionId::down:
        return ffn;
      default:
        return hidden;
    }
  }
  int64_t d_out(ProjectionId p) const {
    switch (p) {
      case ProjectionId::q:
        return heads * head_dim();
      case ProjectionId::k:
      case ProjectionId::v:
        return kv_heads * head_dim();
      case ProjectionId::gate:
      case ProjectionId::up:
        return ffn;
      default:
        return hidden;
    }
  }
};

}  // namespace bottle
