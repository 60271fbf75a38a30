#include "model/llama.h"

#include <cmath>

#include "nn/linear.h"

namespace bottle {
namespace {

std::string projection_prefix(int layer, ProjectionId p) {
  const bool attn =
      p == ProjectionId::q || p == ProjectionId::k || p == ProjectionId::v || p == ProjectionId::o;
  return fmt::format("model.layers.{}.{}.{}_proj", layer, attn ? "self_attn" : "mlp",
                     kProjectionNames[int(p)]);
}

std::string layer_prefix(int layer) { return fmt::format("model.layers.{}", layer); }

Tensor view(Tensor t, Shape shape) {
  t.shape = shape;
  return t;
}

}  // namespace

LlamaModel::LlamaModel(const ModelConfig& config) : config_(config) {
  config_.validate("model config", false);
  declare_parameters();
  params_.allocate();
  bind_parameters();
}

void LlamaModel::declare_parameters() {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size;
  params_.declare(
      {"model.embed_tokens.weight", {c.vocab_size, d}, ParamInit::normal, 0.02f, false});
  for (int l = 0; l < c.num_layers; ++l) {
    params_.declare({layer_prefix(l) + ".input_layernorm.weight", {d}, ParamInit::ones, 0, false});
    params_.declare(
        {layer_prefix(l) + ".post_attention_layernorm.weight", {d}, ParamInit::ones, 0, false});
    for (int i = 0; i < kNumProjections; ++i) {
      const auto p = ProjectionId(i);
      const std::string prefix = projection_prefix(l, p);
      const int64_t din = c.d_in(p), dout = c.d_out(p), r = c.rank_of(p);
      if (c.bottleneck == BottleneckKind::none) {
        params_.declare({prefix + ".weight", {dout, din}});
        continue;
      }
      const float std = std::pow(float(r), -0.25f) * std::pow(float(din + dout), -0.25f);
      params_.declare({prefix + ".A.weight", {r, din}, ParamInit::normal, std});
      params_.declare({prefix + ".B.weight", {dout, r}, ParamInit::normal, std});
      if (c.bottleneck == BottleneckKind::lax && l > 0) {
        params_.declare({prefix + ".G.weight", {r, r}, ParamInit::normal, 0.02f});
        params_.declare({prefix + ".ln.weight", {r}, ParamInit::ones, 0, false});
        params_.declare({prefix + ".ln.bias", {r}, ParamInit::zeros, 0, false});
      }
    }
  }
  params_.declare({"model.norm.weight", {d}, ParamInit::ones, 0, false});
  if (!c.tie_embeddings) params_.declare({"lm_head.weight", {c.vocab_size, d}});
}

void LlamaModel::bind_parameters() {
  const ModelConfig& c = config_;
  embedding_ = params_.get("model.embed_tokens.weight");
  final_norm_weight_ = params_.get("model.norm.weight");
  lm_head_ = c.tie_embeddings ? embedding_ : params_.get("lm_head.weight");
  final_norm_.weight = final_norm_weight_;
  final_norm_.eps = c.rms_norm_eps;
  blocks_.resize(c.num_layers);
  for (int l = 0; l < c.num_layers; ++l) {
    Block& b = blocks_[l];
    b.norm1.weight = params_.get(layer_prefix(l) + ".input_layernorm.weight");
    b.norm2.weight = params_.get(layer_prefix(l) + ".post_attention_layernorm.weight");
    b.norm1.eps = b.norm2.eps = c.rms_norm_eps;
    for (int i = 0; i < kNumProjections; ++i) {
      const auto p = ProjectionId(i);
      const std::string prefix = projection_prefix(l, p);
      Projection& proj = b[p];
      proj.kind = c.bottleneck;
      proj.d_in = c.d_in(p);
      proj.d_out = c.d_out(p);
      if (c.bottleneck == BottleneckKind::none) {
        proj.weight = params_.get(prefix + ".weight");
        continue;
      }
      proj.rank = c.rank_of(p);
      proj.A = params_.get(prefix + ".A.weight");
      proj.B = params_.get(prefix + ".B.weight");
      proj.crossing = c.bottleneck == BottleneckKind::lax && l > 0;
      if (proj.crossing) {
        proj.G = params_.get(prefix + ".G.weight");
        proj.ln_w = params_.get(prefix + ".ln.weight");
        proj.ln_b = params_.get(prefix + ".ln.bias");
      }
    }
  }
}

void LlamaModel::allocate_activations(int64_t batch, int64_t seq) {
  const ModelConfig& c = config_;
  BOTTLE_CHECK(batch > 0 && seq > 0, "micro-batch {} x sequence {} must be positive", batch, seq);
  BOTTLE_CHECK(seq <= c.max_seq_len, "sequence length {} exceeds the model's max_seq_len {}", seq,
               c.max_seq_len);
  batch_ = batch;
  seq_ = seq;
  activations_ = std::make_unique<Arena>(MemoryTag::activations);
  Arena& a = *activations_;
  const int64_t n = batch * seq, d = c.hidden_size, dq = c.num_heads * c.head_dim(),
                dkv = c.num_kv_heads * c.head_dim(), dff = c.intermediate_size;
  residual_.clear();
  for (int l = 0; l <= c.num_layers; ++l) residual_.push_back(a.alloc({n, d}));
  for (Block& b : blocks_) {
    b.norm1.allocate_activations(a, n, d);
    b.norm2.allocate_activations(a, n, d);
    for (Projection& p : b.proj) p.allocate_activations(a, n);
    b.attention = Attention{};
    b.attention.batch = batch;
    b.attention.seq = seq;
    b.attention.heads = c.num_heads;
    b.attention.kv_heads = c.num_kv_heads;
    b.attention.head_dim = c.head_dim();
    b.attention.rope_theta = c.rope_theta;
    b.attention.allocate_activations(a);
    b.q = a.alloc({n, dq});
    b.k = a.alloc({n, dkv});
    b.v = a.alloc({n, dkv});
    b.h = a.alloc({n, d});
    b.gate = a.alloc({n, dff});
    b.up = a.alloc({n, dff});
    b.gated = a.alloc({n, dff});
  }
  final_norm_.allocate_activations(a, n, d);
  logits_ = a.alloc({n, c.vocab_size});
  loss_.allocate_activations(a, n, c.vocab_size);
  grad_.residual = a.alloc({n, d});
  grad_.normed = a.alloc({n, d});
  grad_.attn = a.alloc({n, dq});
  grad_.q = a.alloc({n, dq});
  grad_.k = a.alloc({n, dkv});
  grad_.v = a.alloc({n, dkv});
  grad_.gate = a.alloc({n, dff});
  grad_.up = a.alloc({n, dff});
  grad_.gated = a.alloc({n, dff});
  grad_.logits = a.alloc({n, c.vocab_size});
}

Tensor LlamaModel::prev_latent(int layer, ProjectionId p) const {
  return blocks_[layer][p].crossing ? blocks_[layer - 1].proj[int(p)].u : Tensor{};
}

Tensor LlamaModel::prev_latent_grad(int layer, ProjectionId p) const {
  return blocks_[layer][p].crossing ? blocks_[layer - 1].proj[int(p)].du : Tensor{};
}

Tensor LlamaModel::forward_logits(Backend& be, Tensor tokens) {
  BOTTLE_CHECK(activations_, "forward before allocate_activations");
  BOTTLE_CHECK(tokens.numel() == batch_ * seq_, "forward: expected {} x {} tokens", batch_, seq_);
  be.embedding_forward(residual_[0], tokens, embedding_.value);
  for (int l = 0; l < config_.num_layers; ++l) block_forward(be, l, residual_[l], residual_[l + 1]);
  final_norm_.forward(be, residual_.back());
  linear_forward(be, logits_, final_norm_.out, lm_head_.value);
  return logits_;
}

float LlamaModel::forward(Backend& be, Tensor tokens, Tensor targets) {
  BOTTLE_CHECK(targets.numel() == batch_ * seq_, "forward: expected {} x {} targets", batch_, seq_);
  return loss_.forward(be, forward_logits(be, tokens), targets);
}

void LlamaModel::block_forward(Backend& be, int l, Tensor x, Tensor out) {
  Block& b = blocks_[l];
  using P = ProjectionId;
  b.norm1.forward(be, x);
  b[P::q].forward(be, b.q, b.norm1.out, prev_latent(l, P::q));
  b[P::k].forward(be, b.k, b.norm1.out, prev_latent(l, P::k));
  b[P::v].forward(be, b.v, b.norm1.out, prev_latent(l, P::v));
  b.attention.forward(be, b.q, b.k, b.v);
  const Tensor attn_out = view(b.attention.out, b.q.shape);
  b[P::o].forward(be, b.h, attn_out, prev_latent(l, P::o));
  be.add(b.h, b.h, x);
  b.norm2.forward(be, b.h);
  b[P::gate].forward(be, b.gate, b.norm2.out, prev_latent(l, P::gate));
  b[P::up].forward(be, b.up, b.norm2.out, prev_latent(l, P::up));
  be.swiglu_forward(b.gated, b.gate, b.up, config_.gate_act());
  b[P::down].forward(be, out, b.gated, prev_latent(l, P::down));
  be.add(out, out, b.h);
}

void LlamaModel::backward(Backend& be, Tensor tokens, Tensor targets, float loss_scale) {
  const int64_t n = batch_ * seq_;
  be.fill_zero(grad_.logits);
  loss_.backward(be, grad_.logits, targets, loss_scale / float(n));
  linear_backward(be, grad_.normed, lm_head_.grad, grad_.logits, final_norm_.out, lm_head_.value,
                  /*accumulate_dx=*/false);
  be.fill_zero(grad_.residual);
  final_norm_.backward(be, grad_.residual, grad_.normed, residual_.back());
  for (int l = config_.num_layers - 1; l >= 0; --l) block_backward(be, l, residual_[l]);
  be.embedding_backward(embedding_.grad, tokens, grad_.residual);
}

// On entry grad_.residual holds ∂loss/∂(block output); on exit ∂loss/∂x. The residual
// connections pass it through unchanged, so each branch only adds its share.
void LlamaModel::block_backward(Backend& be, int l, Tensor x) {
  Block& b = blocks_[l];
  GradientScratch& g = grad_;
  using P = ProjectionId;
  // The first projection to write a fresh gradient buffer overwrites it (no zeroing pass).
  auto project_back = [&](P p, Tensor dx, Tensor dy, Tensor in, bool accumulate_dx = true) {
    b[p].backward(be, dx, dy, in, prev_latent(l, p), prev_latent_grad(l, p), accumulate_dx);
  };
  // MLP branch: out = h + down(act(gate(n2)) ⊙ up(n2)).
  project_back(P::down, g.gated, g.residual, b.gated, false);
  be.fill_zero(g.gate);
  be.fill_zero(g.up);
  be.swiglu_backward(g.gate, g.up, g.gated, b.gate, b.up, config_.gate_act());
  project_back(P::gate, g.normed, g.gate, b.norm2.out, false);
  project_back(P::up, g.normed, g.up, b.norm2.out);
  b.norm2.backward(be, g.residual, g.normed, b.h);
  // Attention branch: h = x + o(attention(q(n1), k(n1), v(n1))).
  const Tensor attn_out = view(b.attention.out, b.q.shape);
  project_back(P::o, g.attn, g.residual, attn_out, false);
  be.fill_zero(g.q);
  be.fill_zero(g.k);
  be.fill_zero(g.v);
  b.attention.backward(be, g.q, g.k, g.v, g.attn, b.q, b.k, b.v);
  project_back(P::q, g.normed, g.q, b.norm1.out, false);
  project_back(P::k, g.normed, g.k, b.norm1.out);
  project_back(P::v, g.normed, g.v, b.norm1.out);
  b.norm1.backward(be, g.residual, g.normed, x);
}

double LlamaModel::flops_per_step(int64_t tokens, int64_t seq) const {
  const ModelConfig& c = config_;
  double per_token = 2.0 * double(c.vocab_size) * double(c.hidden_size);  // LM head
  for (int i = 0; i < kNumProjections; ++i) {
    const auto p = ProjectionId(i);
    const double din = double(c.d_in(p)), dout = double(c.d_out(p)), r = double(c.rank_of(p));
    double layer = c.bottleneck == BottleneckKind::none ? 2.0 * din * dout : 2.0 * r * (din + dout);
    per_token += layer * double(c.num_layers);
    if (c.bottleneck == BottleneckKind::lax) per_token += 2.0 * r * r * double(c.num_layers - 1);
  }
  // q·kᵀ and p·v: 2·S·hd multiply-adds per head each.
  per_token += 4.0 * double(seq) * double(c.num_heads * c.head_dim()) * double(c.num_layers);
  return 3.0 * per_token * double(tokens);
}

}  // namespace bottle
