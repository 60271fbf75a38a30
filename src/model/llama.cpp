#include "model/llama.h"

#include <chrono>
#include <cmath>
#include <stdexcept>

#include "nn/linear.h"
#include "parallel/mappings.h"

namespace bottle {

std::string projection_prefix(int layer, ProjectionId p) {
  const bool attn =
      p == ProjectionId::q || p == ProjectionId::k || p == ProjectionId::v || p == ProjectionId::o;
  return fmt::format("model.layers.{}.{}.{}_proj", layer, attn ? "self_attn" : "mlp",
                     kProjectionNames[int(p)]);
}

namespace {

using P = ProjectionId;

std::string layer_prefix(int layer) { return fmt::format("model.layers.{}", layer); }

// Projections in the order grouping wants their parameters side by side.
constexpr std::array<std::array<ProjectionId, 3>, 4> kGroups = {
    {{P::q, P::k, P::v}, {P::o, P::o, P::o}, {P::gate, P::up, P::up}, {P::down, P::down, P::down}}};
constexpr std::array<size_t, 4> kGroupSizes = {3, 1, 2, 1};

const TpLayout& layout_of(const TensorParallel& tp) {
  if (!tp.layout) throw std::invalid_argument("a model needs a TP layout (TensorParallel::layout)");
  return *tp.layout;
}

}  // namespace

void validate_pipeline_stages(int stages, int64_t layers) {
  if (stages < 1 || stages > layers)
    fail_setting(Setting::pp, "{} must be between 1 and {} ({}), got {}", mention(Setting::pp),
                 mention(Setting::num_layers), layers, stages);
}

LlamaModel::LlamaModel(const ModelConfig& config)
    : LlamaModel(config, TensorParallel{&default_tp_layout(config.shape())}) {}

LlamaModel::LlamaModel(const ModelConfig& config, TensorParallel tp, ParamSharding sharding,
                       PipelineStage stage, bool reserve_only, Backend& memory, DType compute)
    : config_(config),
      tp_(tp),
      layout_(layout_of(tp)),
      stage_(stage),
      reserve_only_(reserve_only),
      memory_(&memory),
      compute_(compute) {
  config_.validate("model config", false);
  validate_layout(layout_, config_.shape(), tp_.size());
  const int layers = int(config_.num_layers);
  validate_pipeline_stages(stage_.stages, layers);
  first_layer_ = stage_.first_layer(layers);
  end_layer_ = stage_.end_layer(layers);
  ends_ = layout_.ends(config_.shape());
  declare_parameters(sharding);
  params_.allocate(memory, sharding, reserve_only_, compute_);
  bind_parameters();
}

void LlamaModel::declare_parameters(const ParamSharding& sharding) {
  const ModelConfig& c = config_;
  const int64_t d = c.hidden_size, t = tp_.size();
  // The units: the embedding, each block, the head. Under ZeRO-2 and 3 each starts on a
  // multiple of the shard count, and a tied table's gradients (and under ZeRO-3 its values)
  // are kept whole (ParamUnit::kept).
  const int64_t align = sharding.grad_slots ? sharding.ranks : 1;
  auto unit = [&](bool kept = false) { params_.begin_unit(align, kept && sharding.grad_slots); };
  // Declares `spec` split along `dim` (kWhole: whole on every rank).
  auto declare = [&](ParamSpec spec, int dim) {
    spec.full_shape = spec.shape;
    if (dim >= 0 && t > 1) {
      spec.shape.dims[dim] /= t;
      spec.shard_dim = dim;
      spec.shard_offset = spec.shape[dim] * tp_.rank();
    }
    params_.declare(std::move(spec));
  };
  const ParameterSplits split = layout_.parameter_splits(c.shape());
  if (stage_.first()) {
    unit(c.tie_embeddings);
    declare({"model.embed_tokens.weight", {c.vocab_size, d}, ParamInit::normal, 0.02f, false},
            split.embedding);
  }
  for (int l = first_layer_; l < end_layer_; ++l) {
    unit();
    declare({layer_prefix(l) + ".input_layernorm.weight", {d}, ParamInit::ones, 0, false},
            split.block_norm);
    declare({layer_prefix(l) + ".post_attention_layernorm.weight", {d}, ParamInit::ones, 0, false},
            split.block_norm);
    for (size_t gi = 0; gi < kGroups.size(); ++gi) {
      const auto group = std::span(kGroups[gi]).first(kGroupSizes[gi]);
      if (c.bottleneck == BottleneckKind::none) {
        for (P p : group)
          declare({projection_prefix(l, p) + ".weight", {c.d_out(p), c.d_in(p)}},
                  split.weight[size_t(p)]);
        continue;
      }
      auto factor_std = [&](P p) {
        return std::pow(float(c.rank_of(p)), -0.25f) *
               std::pow(float(c.d_in(p) + c.d_out(p)), -0.25f);
      };
      for (P p : group)
        declare({projection_prefix(l, p) + ".A.weight",
                 {c.rank_of(p), c.d_in(p)},
                 ParamInit::normal,
                 factor_std(p)},
                split.A[size_t(p)]);
      for (P p : group)
        declare({projection_prefix(l, p) + ".B.weight",
                 {c.d_out(p), c.rank_of(p)},
                 ParamInit::normal,
                 factor_std(p)},
                split.B[size_t(p)]);
      if (c.bottleneck == BottleneckKind::lax && l > 0)
        for (P p : group) {
          const std::string prefix = projection_prefix(l, p);
          const int64_t r = c.rank_of(p);
          declare({prefix + ".G.weight", {r, r}, ParamInit::normal, 0.02f}, split.lax_crossing);
          declare({prefix + ".ln.weight", {r}, ParamInit::ones, 0, false}, split.lax_crossing);
          declare({prefix + ".ln.bias", {r}, ParamInit::zeros, 0, false}, split.lax_crossing);
        }
    }
  }
  if (!stage_.last()) return;
  unit(c.tie_embeddings && !stage_.first());
  declare({"model.norm.weight", {d}, ParamInit::ones, 0, false}, split.final_norm);
  if (!c.tie_embeddings)
    declare({"lm_head.weight", {c.vocab_size, d}}, split.lm_head);
  else if (!stage_.first())  // the last stage's copy of the tied table (Megatron's way)
    declare({"model.embed_tokens.weight", {c.vocab_size, d}, ParamInit::normal, 0.02f, false},
            split.lm_head);
}

void LlamaModel::bind_parameters() {
  const ModelConfig& c = config_;
  if (stage_.first()) embedding_ = params_.get("model.embed_tokens.weight");
  if (stage_.last()) {
    final_norm_weight_ = params_.get("model.norm.weight");
    lm_head_ = params_.get(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
    final_norm_.weight = final_norm_weight_;
    final_norm_.eps = c.rms_norm_eps;
  }
  // Where each block's parameters begin in the flat buffers (they follow one another in
  // model order), and the head's: backward_stage reports its progress by them.
  block_offsets_.assign(size_t(end_layer_ - first_layer_), params_.count());
  head_offset_ = params_.count();
  for (const ParamSpec& spec : params_.specs())
    if (spec.name.starts_with("model.layers.")) {
      const int l = std::stoi(spec.name.substr(std::string_view("model.layers.").size()));
      int64_t& begin = block_offsets_.at(size_t(l - first_layer_));
      begin = std::min(begin, spec.offset);
    } else if (spec.name != "model.embed_tokens.weight") {
      head_offset_ = std::min(head_offset_, spec.offset);
    }
  block_params_.clear();
  for (int l = first_layer_; l < end_layer_; ++l) {
    BlockParams& b = block_params_.emplace_back();
    b.norm1_weight = params_.get(layer_prefix(l) + ".input_layernorm.weight");
    b.norm2_weight = params_.get(layer_prefix(l) + ".post_attention_layernorm.weight");
    for (int i = 0; i < kNumProjections; ++i) {
      const std::string prefix = projection_prefix(l, ProjectionId(i));
      ProjectionParams& p = b.proj[size_t(i)];
      if (c.bottleneck == BottleneckKind::none) {
        p.weight = params_.get(prefix + ".weight");
        continue;
      }
      p.A = params_.get(prefix + ".A.weight");
      p.B = params_.get(prefix + ".B.weight");
      if (c.bottleneck == BottleneckKind::lax && l > 0) {
        p.G = params_.get(prefix + ".G.weight");
        p.ln_w = params_.get(prefix + ".ln.weight");
        p.ln_b = params_.get(prefix + ".ln.bias");
      }
    }
  }
}

BlockSpec LlamaModel::block_spec(int layer, int64_t batch, int64_t seq, Recompute policy) const {
  const ModelConfig& c = config_;
  return {.model = c.shape(),
          .t = tp_.size(),
          .tp_rank = tp_.rank(),
          .crossing = c.bottleneck == BottleneckKind::lax && layer > 0,
          .grouping = tp_.grouping,
          .norm_eps = c.rms_norm_eps,
          .rope_theta = c.rope_theta,
          .gate_act = c.gate_act(),
          .batch = batch,
          .seq = seq,
          .policy = policy,
          .keeps_weight_grad_inputs = defer_weight_grads_,
          .params = block_params_[size_t(layer - first_layer_)]};
}

void LlamaModel::allocate_activations(int64_t batch, int64_t seq, int slots, Recompute policy,
                                      bool defer_weight_grads) {
  const ModelConfig& c = config_;
  BOTTLE_CHECK(batch > 0 && seq > 0, "micro-batch {} x sequence {} must be positive", batch, seq);
  BOTTLE_CHECK(seq <= c.max_seq_len, "sequence length {} exceeds the model's max_seq_len {}", seq,
               c.max_seq_len);
  BOTTLE_ASSERT(slots >= 1, "{} micro-batch slots", slots);
  validate_recompute(policy, layout_, c.shape());
  batch_ = batch;
  seq_ = seq;
  recompute_ = policy;
  // TP overlap halves a micro-batch by its sequences; one that cannot be halved (an odd batch
  // of eval or sample; training's is checked with its key) runs serially.
  halved_ = tp_.overlap && batch % 2 == 0;
  // A deferred weight gradient reads its block's buffers after the block's backward: they must
  // be the block's own, not rebuilt by recomputation or shared by two halves.
  BOTTLE_CHECK(!defer_weight_grads || (policy == Recompute::none && !halved_),
               "a split backward (B and W passes) keeps every block's activations: it runs "
               "without recomputation and without TP overlap");
  defer_weight_grads_ = defer_weight_grads;
  BOTTLE_CHECK(!halved_ || !crosses_boundaries(),
               "TP overlap does not run LaX over a pipeline: its latents cross the stage "
               "boundary whole");
  // Each half's blocks are made for half the sequences.
  const int halves = halved_ ? 2 : 1;
  const int64_t block_batch = batch / halves;
  activations_ = std::make_unique<Arena>(MemoryTag::activations, *memory_, reserve_only_);
  comm_ = std::make_unique<Arena>(MemoryTag::comm, *memory_, reserve_only_);
  activations_->set_act_dtype(compute_);
  comm_->set_act_dtype(compute_);
  Arena& a = *activations_;
  const int64_t n = batch * seq, d = c.hidden_size, v_local = c.vocab_size / tp_.size();
  const int64_t d_res = layout_.block_dims(c.shape(), tp_.size()).d_res;
  const int blocks = end_layer_ - first_layer_;
  // Blocks share what they do not keep, one block at a time: lay out the widest block (the
  // last: LaX's first block has no crossing) in reserve to size the shared regions.
  std::array<RegionAllocator, 2> recomputed, grads, comm;  // per half; [0] when serial
  if (blocks > 0) {
    Arena plan_kept(MemoryTag::activations, true), plan_recomputed(MemoryTag::activations, true),
        plan_grads(MemoryTag::activations, true), plan_comm(MemoryTag::comm, true);
    for (Arena* plan : {&plan_kept, &plan_recomputed, &plan_grads, &plan_comm})
      plan->set_act_dtype(compute_);
    layout_.make_block(block_spec(end_layer_ - 1, block_batch, seq, policy),
                       {plan_kept, policy == Recompute::none ? plan_kept : plan_recomputed,
                        plan_grads, plan_comm});
    auto region = [&](Arena& arena, const Arena& plan, const char* what) {
      RegionAllocator r(arena.alloc({int64_t(plan.bytes() / sizeof(float))}), what);
      r.set_act_dtype(compute_);
      return r;
    };
    // The halves are in flight together, each in a different block: one set of regions each.
    for (int h = 0; h < halves; ++h) {
      recomputed[h] = region(a, plan_recomputed, "recomputed block activations");
      // (A split backward's blocks keep gradients of their own.)
      if (!defer_weight_grads) grads[h] = region(a, plan_grads, "block gradients");
      comm[h] = region(*comm_, plan_comm, "block communication scratch");
    }
  }
  slots_.clear();
  slots_.resize(size_t(slots));
  for (Slot& slot : slots_) {
    // Each slot's blocks share the parameters; the activations are the slot's own.
    for (int i = 0; i <= blocks; ++i) slot.residual.push_back(a.alloc_act({n, d_res}));
    for (int h = 0; h < halves; ++h) {
      Allocator& recomputed_from =
          policy == Recompute::none ? static_cast<Allocator&>(a) : recomputed[h];
      // A split backward's W pass reads each block's gradients after the next block's B.
      Allocator& grads_from = defer_weight_grads ? static_cast<Allocator&>(a) : grads[h];
      for (int l = first_layer_; l < end_layer_; ++l) {
        recomputed[h].rewind();
        grads[h].rewind();
        comm[h].rewind();
        (halved_ ? slot.halves[size_t(h)] : slot.blocks)
            .push_back(layout_.make_block(block_spec(l, block_batch, seq, policy),
                                          {a, recomputed_from, grads_from, comm[h]}));
      }
    }
    if (defer_weight_grads && stage_.last()) slot.dlogits = a.alloc_act({n, v_local});
    slot.weight_grads.assign(size_t(blocks) + 1, {});
    if (ends_.sharded_residual && (stage_.first() || stage_.last()))
      slot.whole = a.alloc_act({n, d});
    if (stage_.last()) {
      slot.final_norm = final_norm_;
      slot.final_norm.allocate_activations(a, n, d);
      slot.logits = a.alloc_act({n, v_local});
      slot.loss.allocate_activations(a, n);
    } else {
      slot.output_grad = a.alloc_act({n, d_res});
    }
    if (!stage_.first()) slot.input_grad = a.alloc_act({n, d_res});
    if (crosses_boundaries()) {
      // The ranks of the latents that cross.
      for (int i = 0; i < kNumProjections; ++i) {
        const int64_t r =
            layout_.projection_dims(c.shape(), ProjectionId(i), tp_.size(), tp_.rank()).rank;
        if (!stage_.first()) {
          slot.boundary.u[size_t(i)] = a.alloc_act({n, r});
          slot.boundary.du[size_t(i)] = a.alloc_act({n, r});
        }
        if (!stage_.last()) slot.latent_grad_in[size_t(i)] = a.alloc_act({n, r});
      }
    }
  }
  if (policy == Recompute::block) recompute_out_ = a.alloc_act({n, d_res});
  if (ends_.sharded_residual) gather_scratch_ = comm_->alloc_act({n * d});
  residual_grad_ = a.alloc_act({n, d_res});
  if (stage_.last()) {
    dlogits_ = a.alloc_act({n, v_local});
    dfinal_ = a.alloc_act({n, d});
    whole_grad_ = a.alloc_act({n, d});
  } else if (stage_.first() && ends_.sharded_residual) {
    whole_grad_ = a.alloc_act({n, d});
  }
}

MemoryBreakdown LlamaModel::memory() const {
  MemoryBreakdown m;
  m[MemoryTag::weights] = params_.bytes() + params_.compute_bytes();
  m[MemoryTag::gradients] = params_.grad_bytes();
  m[MemoryTag::activations] = activations_ ? activations_->bytes() : 0;
  m[MemoryTag::comm] = comm_ ? comm_->bytes() : 0;
  return m;
}

bool LlamaModel::crosses_boundaries() const {
  return config_.bottleneck == BottleneckKind::lax && stage_.stages > 1;
}

std::vector<Tensor> LlamaModel::stage_input(int slot) const {
  const Slot& s = slots_[size_t(slot)];
  std::vector<Tensor> parts{s.residual.front()};
  if (crosses_boundaries())
    for (const Tensor& u : s.boundary.u) parts.push_back(u);
  return parts;
}

std::vector<Tensor> LlamaModel::stage_output(int slot) const {
  const Slot& s = slots_[size_t(slot)];
  std::vector<Tensor> parts{s.residual.back()};
  if (crosses_boundaries())
    for (const Tensor& u : s.blocks.back()->latents().u) parts.push_back(u);
  return parts;
}

std::vector<Tensor> LlamaModel::stage_output_grad(int slot) const {
  const Slot& s = slots_[size_t(slot)];
  std::vector<Tensor> parts{s.output_grad};
  if (crosses_boundaries())
    parts.insert(parts.end(), s.latent_grad_in.begin(), s.latent_grad_in.end());
  return parts;
}

std::vector<Tensor> LlamaModel::stage_input_grad(int slot) const {
  const Slot& s = slots_[size_t(slot)];
  std::vector<Tensor> parts{s.input_grad};
  if (crosses_boundaries())
    for (const Tensor& du : s.boundary.du) parts.push_back(du);
  return parts;
}

namespace {

// Rows [h·N/2, (h+1)·N/2) of t [N, C]: TP overlap's half h of a micro-batch (its sequences
// are whole rows of S tokens each, so a half is a range of rows).
Tensor half_rows(Tensor t, int h) {
  if (t.empty()) return t;
  const int64_t rows = t.rows() / 2, cols = t.numel() / t.rows();
  return t.view(h * rows * cols, {rows, cols});
}

// The latents a half's block i crosses with (LaX): its own block before's. TP overlap refuses
// LaX over a pipeline, so the first block of a stage crosses with nothing across it.
BlockLatents half_latents(const std::vector<std::unique_ptr<TpBlock>>& half, size_t i) {
  return i ? half[i - 1]->latents() : BlockLatents{};
}

// One half's share of a block in backward: its recomputation (when the policy has one), then
// its backward.
TpTask recompute_and_backward(Backend& be, TpBlock& block, const TensorParallel& tp,
                              BlockLatents prev, Tensor x, Tensor recompute_out, Tensor d_residual,
                              bool recompute) {
  if (recompute) co_await block.recompute(be, tp, prev, x, recompute_out);
  co_await block.backward(be, tp, prev, x, d_residual);
}

}  // namespace

size_t LlamaModel::stage_blocks(const Slot& s) const {
  return halved_ ? s.halves[0].size() : s.blocks.size();
}

// The halves meet after every block: ZeRO's gathers before it, the DP hook after it and the
// next block's shared buffers are then the serial pass's concern again.
void LlamaModel::run_in_halves(
    const std::function<TpTask(int half, const TensorParallel& tp)>& pass) const {
  std::array<TpHalf, 2> halves;
  std::array<TensorParallel, 2> tp{tp_, tp_};
  std::array<TpTask, 2> tasks;
  for (int k = 0; k < 2; ++k) {
    halves[size_t(k)].index = k;
    // The calls are counted under the phase the group is in (CommStats::phase), as serially.
    if (tp_.comm) halves[size_t(k)].phase = tp_.comm->stats().phase();
    tp[size_t(k)].half = &halves[size_t(k)];
  }
  // Half 0 runs to its first collective, then half 1 to its own.
  for (int k = 0; k < 2; ++k) tasks[size_t(k)] = pass(k, tp[size_t(k)]);
  run_halves(tasks, halves);
}

void LlamaModel::forward_stage(Backend& be, int slot_index, Tensor tokens, Tensor targets,
                               Tensor loss_sum, const ParamsNeeded& needed) {
  BOTTLE_ASSERT(activations_, "forward before allocate_activations");
  BOTTLE_ASSERT(be.device() == memory_->device(),
                "the model's memory is on {}, but backend '{}' runs on {}",
                device_name(memory_->device()), be.name(), device_name(be.device()));
  BOTTLE_ASSERT(slot_index >= 0 && slot_index < int(slots_.size()), "micro-batch slot {} of {}",
                slot_index, slots_.size());
  Slot& s = slots_[size_t(slot_index)];
  const int64_t first = vocab_first();
  // Parameters lie in model order: the embedding, the blocks, the head (block_offsets_).
  const int64_t all = params_.padded();
  auto need = [&](int64_t end) {
    if (needed) needed(end);
  };
  if (stage_.first()) {
    BOTTLE_ASSERT(tokens.numel() == batch_ * seq_, "forward: expected {} x {} tokens", batch_,
                  seq_);
    need(block_offsets_.empty() ? head_offset_ : block_offsets_[0]);
    if (ends_.hidden_split_embedding) {
      be.embedding_forward(s.residual[0], tokens, embedding_.value);  // [N, d/t], no comm
    } else if (ends_.sharded_residual) {
      vocab_parallel_embedding_forward(be, tp_, s.whole, tokens, embedding_.value, first,
                                       "vocab.fwd.embedding");
      scatter_last_dim_forward(be, tp_, s.residual[0], s.whole);
    } else {
      vocab_parallel_embedding_forward(be, tp_, s.residual[0], tokens, embedding_.value, first,
                                       "vocab.fwd.embedding");
    }
  }
  const size_t blocks = stage_blocks(s);
  for (size_t i = 0; i < blocks; ++i) {
    need(i + 1 < blocks ? block_offsets_[i + 1] : head_offset_);
    if (halved_) {
      run_in_halves([&](int k, const TensorParallel& tp) {
        const auto& half = s.halves[size_t(k)];
        return half[i]->forward(be, tp, half_latents(half, i), half_rows(s.residual[i], k),
                                half_rows(s.residual[i + 1], k));
      });
      continue;
    }
    s.blocks[i]
        ->forward(be, tp_, i ? s.blocks[i - 1]->latents() : s.boundary, s.residual[i],
                  s.residual[i + 1])
        .get();
  }
  need(all);
  if (!stage_.last()) return;
  Tensor last = s.residual.back();
  if (ends_.sharded_residual) {
    // The residual stream is gathered once, at the end of the model.
    gather_last_dim_forward(be, tp_, s.whole, last, gather_scratch_, "model.fwd.final_gather");
    last = s.whole;
  }
  s.final_norm.forward(be, last);
  // The LM head is split by vocabulary rows: its input enters whole on every rank.
  copy_to_forward(tp_, s.final_norm.out);
  linear_forward(be, s.logits, s.final_norm.out, lm_head_.compute);
  if (targets.empty()) return;
  BOTTLE_ASSERT(targets.numel() == batch_ * seq_, "forward: expected {} x {} targets", batch_,
                seq_);
  s.loss.forward(be, tp_, s.logits, targets, first, loss_sum);
}

void LlamaModel::backward_stage(Backend& be, int slot_index, Tensor tokens, Tensor targets,
                                float loss_scale, const GradsReady& ready,
                                const ParamsNeeded& needed) {
  run_backward(be, slot_index, tokens, targets, loss_scale, ready, needed, false);
}

void LlamaModel::backward_input_stage(Backend& be, int slot_index, Tensor tokens, Tensor targets,
                                      float loss_scale) {
  BOTTLE_ASSERT(defer_weight_grads_, "a B pass of a model allocated without deferring W");
  run_backward(be, slot_index, tokens, targets, loss_scale, {}, {}, true);
}

void LlamaModel::weight_stage(int slot_index, const GradsReady& ready) {
  Slot& s = slots_[size_t(slot_index)];
  const CommPhase phase(tp_.comm, kWeightPassPhase);
  auto run = [](std::vector<std::function<void()>>& queued) {
    for (const auto& weight_grad : queued) weight_grad();
    queued.clear();
  };
  const size_t blocks = s.blocks.size();
  if (stage_.last()) {
    run(s.weight_grads[blocks]);
    if (ready) ready(head_offset_);
  }
  for (size_t i = blocks; i-- > 0;) {
    run(s.weight_grads[i]);
    if (ready) ready(block_offsets_[i]);
  }
  // The embedding's gradient came with B.
  if (stage_.first() && ready) ready(0);
}

void LlamaModel::run_backward(Backend& be, int slot_index, Tensor tokens, Tensor targets,
                              float loss_scale, const GradsReady& ready, const ParamsNeeded& needed,
                              bool defer) {
  Slot& s = slots_[size_t(slot_index)];
  // The block's and the head's weight gradients go to the slot's queue where deferred.
  TensorParallel tp = tp_;
  auto queue = [&](size_t segment) {
    if (defer) tp.weight_grads = &s.weight_grads[segment];
  };
  const int64_t n = batch_ * seq_;
  const int64_t first = vocab_first();
  auto need = [&](int64_t end) {
    if (needed) needed(end);
  };
  if (stage_.last()) {
    need(params_.padded());
    // Deferred, the head's weight gradient reads the slot's own gradient of the logits.
    const Tensor dlogits = defer ? s.dlogits : dlogits_;
    s.loss.backward(be, dlogits, s.logits, targets, first, loss_scale / float(n));
    // The head is split by vocabulary rows: dfinal is a partial sum, summed over the TP group
    // while the head's weight gradient, the stage's largest GEMM, runs (TpBackward). The
    // model's ends run outside TP overlap's halves, so the pass ends before get().
    linear_input_grad(be, dfinal_, dlogits, lm_head_.compute, /*accumulate_dx=*/false);
    queue(s.blocks.size());
    co_copy_to_backward(tp, dfinal_, "vocab.bwd.lm_head_in",
                        [&be, grad = lm_head_.grad, dlogits, x = s.final_norm.out] {
                          linear_weight_grad(be, grad, dlogits, x);
                        })
        .get();
    Tensor last = ends_.sharded_residual ? s.whole : s.residual.back();
    be.fill_zero(whole_grad_);
    s.final_norm.backward(be, whole_grad_, dfinal_, last);
    if (ends_.sharded_residual)
      gather_last_dim_backward(be, tp_, residual_grad_, whole_grad_);
    else
      be.copy(residual_grad_, whole_grad_);
    if (ready) ready(head_offset_);
  } else {
    be.copy(residual_grad_, s.output_grad);
    // The next stage's first block crossed with our last latents: its share of their
    // gradients joins theirs before our last block's backward.
    if (crosses_boundaries())
      for (size_t i = 0; i < s.latent_grad_in.size(); ++i)
        be.accumulate(s.blocks.back()->latents().du[i], s.latent_grad_in[i]);
  }
  for (const Tensor& du : s.boundary.du)
    if (!du.empty()) be.fill_zero(du);
  const size_t blocks = stage_blocks(s);
  for (size_t i = blocks; i-- > 0;) {
    need(i + 1 < blocks ? block_offsets_[i + 1] : head_offset_);
    if (halved_) {
      run_in_halves([&](int k, const TensorParallel& tp) {
        const auto& half = s.halves[size_t(k)];
        return recompute_and_backward(be, *half[i], tp, half_latents(half, i),
                                      half_rows(s.residual[i], k), half_rows(recompute_out_, k),
                                      half_rows(residual_grad_, k), recompute_ != Recompute::none);
      });
      // Both halves' gradients of the block are in.
      if (ready) ready(block_offsets_[i]);
      continue;
    }
    const BlockLatents prev = i ? s.blocks[i - 1]->latents() : s.boundary;
    TpBlock& block = *s.blocks[i];
    if (recompute_ != Recompute::none) {
      const auto start = std::chrono::steady_clock::now();
      block.recompute(be, tp_, prev, s.residual[i], recompute_out_).get();
      recompute_seconds_ +=
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    }
    queue(i);
    block.backward(be, tp, prev, s.residual[i], residual_grad_).get();
    if (ready) ready(block_offsets_[i]);
  }
  if (!stage_.first()) {
    be.copy(s.input_grad, residual_grad_);
    return;
  }
  if (ends_.hidden_split_embedding) {
    be.embedding_backward(embedding_.grad, tokens, residual_grad_);
  } else if (ends_.sharded_residual) {
    scatter_last_dim_backward(be, tp_, whole_grad_, residual_grad_, gather_scratch_,
                              "model.bwd.embedding_gather");
    vocab_parallel_embedding_backward(be, tp_, embedding_.grad, tokens, whole_grad_, first);
  } else {
    vocab_parallel_embedding_backward(be, tp_, embedding_.grad, tokens, residual_grad_, first);
  }
  if (ready) ready(0);
}

Tensor LlamaModel::forward_logits(Backend& be, Tensor tokens) {
  BOTTLE_ASSERT(stage_.stages == 1, "forward_logits needs the whole model on this rank");
  BOTTLE_ASSERT(!params_.value_slots(), "forward_logits of a ZeRO-3 model outside a training step");
  forward_stage(be, 0, tokens, Tensor{}, Tensor{});
  return slots_[0].logits;
}

float LlamaModel::forward(Backend& be, Tensor tokens, Tensor targets) {
  BOTTLE_ASSERT(stage_.stages == 1,
                "forward needs the whole model on this rank (pipeline: "
                "forward_stage)");
  BOTTLE_ASSERT(!params_.value_slots(), "forward() of a ZeRO-3 model outside a training step");
  // One f64 for the loss, in the backend's memory, made on first use (tools and tests).
  if (loss_scalar_.empty()) {
    scalar_arena_ = std::make_unique<Arena>(MemoryTag::workspace, *memory_, reserve_only_);
    loss_scalar_ = scalar_arena_->alloc({1}, DType::f64);
  }
  be.fill_zero(loss_scalar_);
  forward_stage(be, 0, tokens, targets, loss_scalar_);
  double loss = 0.0;
  be.to_host(&loss, loss_scalar_);
  return float(loss);
}

void LlamaModel::backward(Backend& be, Tensor tokens, Tensor targets, float loss_scale) {
  // Slots are zeroed and emptied by the data-parallel trainer between units.
  BOTTLE_ASSERT(!params_.grad_slots(), "backward() of a ZeRO-2 model outside a training step");
  backward_stage(be, 0, tokens, targets, loss_scale);
}

bool LlamaModel::holds_tied_copy() const {
  return config_.tie_embeddings && stage_.last() && !stage_.first();
}

void LlamaModel::reduce_tied_embedding_grad(Communicator* group) {
  if (!config_.tie_embeddings || stage_.stages == 1 || !(stage_.first() || stage_.last())) return;
  BOTTLE_ASSERT(group && group->size() == 2,
                "tied embeddings over a pipeline need the first-and-last-stage group");
  const Param table = stage_.first() ? embedding_ : lm_head_;
  group->all_reduce(table.grad, ReduceOp::sum, "pp.tied_embedding");
}

std::pair<int64_t, int64_t> LlamaModel::tied_grad_range() const {
  if (!config_.tie_embeddings || stage_.stages == 1 || !(stage_.first() || stage_.last()))
    return {0, 0};
  // Both stages hold the table under its own name (the last stage's copy too).
  for (const ParamSpec& spec : params_.specs())
    if (spec.name == "model.embed_tokens.weight")
      return {spec.offset, spec.offset + spec.shape.numel()};
  return {0, 0};
}

std::vector<SumRange> LlamaModel::grad_norm_ranges(int64_t begin, int64_t end) const {
  if (end < 0) end = params_.padded();
  std::vector<SumRange> ranges;
  for (const ParamSpec& spec : params_.specs()) {
    // The tied table is counted once, on the first stage.
    if (holds_tied_copy() && spec.name == "model.embed_tokens.weight") continue;
    const int64_t lo = std::max(spec.offset, begin),
                  hi = std::min(spec.offset + spec.shape.numel(), end);
    if (lo >= hi) continue;
    ranges.push_back({lo, hi - lo, spec.sharded() ? kShardedSlot : kWholeSlot});
  }
  return ranges;
}

double LlamaModel::grad_sum_squares(Backend& be, int64_t begin, int64_t end) const {
  double parts[2] = {0.0, 0.0};
  for (const SumRange& r : grad_norm_ranges(begin, end))
    parts[r.slot] += be.sum_squares(params_.grads().view(r.offset, {r.count}));
  return reduce_scalar(tp_.comm, parts[kShardedSlot], ReduceOp::sum, "tp.grad_norm") +
         parts[kWholeSlot];
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
  // q·kᵀ and p·v over the causal triangle, as the kernels run them: a token attends to
  // (S + 1) / 2 keys on average, one multiply-add per key and head dimension each. Counting the
  // full S × S square would call work that never runs "model FLOPs" and can give an MFU
  // above 100 % at long sequences.
  per_token += 2.0 * double(seq + 1) * double(c.num_heads * c.head_dim()) * double(c.num_layers);
  return 3.0 * per_token * double(tokens);
}

}  // namespace bottle
