#pragma once
// The LLaMA model on one process: embedding, L blocks, final RMSNorm, LM head and loss,
// with explicit forward and backward over activation buffers allocated once per
// micro-batch shape.
#include <array>
#include <memory>
#include <vector>

#include "core/arena.h"
#include "core/backend.h"
#include "model/config.h"
#include "model/parameters.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/projection.h"
#include "nn/rmsnorm.h"

namespace bottle {

struct Block {
  RMSNorm norm1, norm2;
  std::array<Projection, kNumProjections> proj;
  Attention attention;
  Tensor q, k, v;   // [N, H·hd], [N, Hkv·hd] x2 (q, k rotated in place)
  Tensor h;         // [N, d] residual after attention
  Tensor gate, up;  // [N, d_ff]
  Tensor gated;     // [N, d_ff] act(gate) ⊙ up

  Projection& operator[](ProjectionId p) { return proj[int(p)]; }
  const Projection& operator[](ProjectionId p) const { return proj[int(p)]; }
};

// Activation gradients, shared by all blocks (backward visits one block at a time).
struct GradientScratch {
  Tensor residual;         // [N, d] ∂loss/∂(residual stream at the current depth)
  Tensor normed;           // [N, d] ∂/∂(RMSNorm output)
  Tensor attn;             // [N, H·hd]
  Tensor q, k, v;          // [N, H·hd], [N, Hkv·hd] x2
  Tensor gate, up, gated;  // [N, d_ff]
  Tensor logits;           // [N, V]
};

class LlamaModel {
 public:
  explicit LlamaModel(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  ParameterStore& parameters() { return params_; }
  const ParameterStore& parameters() const { return params_; }
  void init_weights(uint64_t seed) { params_.initialize(seed); }

  // Buffers for micro-batches of `batch` rows of `seq` tokens.
  void allocate_activations(int64_t batch, int64_t seq);
  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }

  // tokens: i32 [B, S]. Returns the logits [B·S, V].
  Tensor forward_logits(Backend& be, Tensor tokens);
  // tokens, targets: i32 [B, S]. Returns the mean cross-entropy.
  float forward(Backend& be, Tensor tokens, Tensor targets);
  // Adds ∂(mean loss)·loss_scale/∂θ into the parameter gradients (+=).
  void backward(Backend& be, Tensor tokens, Tensor targets, float loss_scale = 1.0f);
  void zero_grad(Backend& be) { be.fill_zero(params_.grads()); }

  Tensor logits() const { return logits_; }  // [B·S, V] of the last forward

  // Model FLOPs of one forward + backward over `tokens` tokens of sequence length `seq`:
  // every GEMM, attention's two included (3× the forward).
  double flops_per_step(int64_t tokens, int64_t seq) const;

 private:
  void declare_parameters();
  void bind_parameters();
  Tensor prev_latent(int layer, ProjectionId p) const;
  Tensor prev_latent_grad(int layer, ProjectionId p) const;
  void block_forward(Backend& be, int layer, Tensor x, Tensor out);
  void block_backward(Backend& be, int layer, Tensor x);

  ModelConfig config_;
  ParameterStore params_;
  Param embedding_, final_norm_weight_, lm_head_;
  std::vector<Block> blocks_;
  RMSNorm final_norm_;
  CrossEntropy loss_;

  int64_t batch_ = 0, seq_ = 0;
  std::unique_ptr<Arena> activations_;
  std::vector<Tensor> residual_;  // L+1 x [N, d]: the input of each block, then the output
  Tensor logits_;                 // [N, V]
  GradientScratch grad_;
};

}  // namespace bottle
