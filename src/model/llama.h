#pragma once
// The LLaMA model of one tensor-parallel rank of one pipeline stage: embedding (first
// stage), its contiguous share of the L blocks, final RMSNorm, LM head and loss (last
// stage), with explicit forward and backward over activation buffers allocated once per
// micro-batch shape, one set per micro-batch a schedule keeps in flight. With one rank it
// is the serial model; with t TP ranks each holds the slices its TP layout gives it
// (parallel/tp_layout.h) and the collectives run inside. The model asks the layout what to
// split, how wide each buffer is and how the embedding and LM head meet the blocks; it never
// asks which mode it runs.
#include <array>
#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "core/arena.h"
#include "model/config.h"
#include "model/parameters.h"
#include "nn/rmsnorm.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_layout.h"
#include "parallel/tp_layouts.h"
#include "parallel/tp_overlap.h"
#include "parallel/vocab_parallel.h"

namespace bottle {

// This rank's pipeline stage: blocks [first_layer, end_layer) of the balanced split of L
// blocks over `stages` (docs/design.md §8).
struct PipelineStage {
  int stages = 1, stage = 0;
  bool first() const { return stage == 0; }
  bool last() const { return stage == stages - 1; }
  int first_layer(int layers) const { return layers * stage / stages; }
  int end_layer(int layers) const { return layers * (stage + 1) / stages; }
};
// Throws SettingError(Setting::pp) unless 1 <= stages <= layers (every stage holds a block).
void validate_pipeline_stages(int stages, int64_t layers);

// The checkpoint name of projection p of block `layer` without its suffix, e.g.
// "model.layers.3.self_attn.q_proj" (HF's names; docs/design.md §12).
std::string projection_prefix(int layer, ProjectionId p);

// How the flat parameter buffers are cut for data parallelism (docs/design.md §9).
class LlamaModel {
 public:
  // tp.comm null: one rank. Throws SettingError when tp.layout does not fit the model, tp's
  // size does not divide a dimension it splits, or the stages are not 1 to L.
  // sharding: the flat parameter buffers' size a multiple of the ZeRO shards', under ZeRO-2
  // the gradients in unit slots, under ZeRO-3 the values too (ParamSharding).
  // stage: this rank's share of a pipeline (the whole model by default).
  // reserve_only: a plan of the rank's footprint (memory()) that holds no memory; it can
  // lay out buffers but not run.
  // memory: the backend whose memory holds the parameters and activations; forward and
  // backward then run on a backend of the same device.
  // compute: f32, or bf16 for mixed precision (docs/design.md): GEMMs read bf16 copies of
  // the fp32 master weights, and activations are stored in bf16.
  explicit LlamaModel(const ModelConfig& config, TensorParallel tp, ParamSharding sharding = {},
                      PipelineStage stage = {}, bool reserve_only = false,
                      Backend& memory = host_backend(), DType compute = DType::f32);
  // One rank, in the model's default layout.
  explicit LlamaModel(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const TensorParallel& tensor_parallel() const { return tp_; }
  ParameterStore& parameters() { return params_; }
  const ParameterStore& parameters() const { return params_; }
  void init_weights(uint64_t seed) { params_.initialize(seed); }

  const PipelineStage& stage() const { return stage_; }

  // Buffers for `slots` micro-batches in flight of `batch` rows of `seq` tokens, keeping
  // what `policy` keeps (parallel/recompute.h); throws SettingError(Setting::recompute) when
  // the policy does not fit the model or TP layout.
  // defer_weight_grads: the backward may run as two passes, B (backward_stage with
  // defer_weights) and W (weight_stage), as a zero-bubble schedule runs it: each block keeps its
  // gradient buffers, and each slot its own gradient of the logits, until W (more memory).
  void allocate_activations(int64_t batch, int64_t seq, int slots = 1,
                            Recompute policy = Recompute::none, bool defer_weight_grads = false);
  Recompute recompute() const { return recompute_; }
  // Wall time spent recomputing blocks in backward since the last reset (the policy's cost).
  // Under TP overlap the halves' recomputation interleaves with other work and is not timed.
  double recompute_seconds() const { return recompute_seconds_; }
  void reset_recompute_seconds() { recompute_seconds_ = 0; }
  int64_t batch() const { return batch_; }
  int slots() const { return int(slots_.size()); }  // micro-batches in flight
  int64_t seq() const { return seq_; }

  // One pipeline stage's share of a micro-batch held in `slot`. A first stage embeds the
  // tokens, others read stage_input(slot) (the previous stage's output); a last stage with
  // targets adds the micro-batch's mean loss to loss_sum (f64 [1] in the backend's memory, so
  // that the host need not wait for it). Token ids are the caller's to check (on the host,
  // where a batch is read). backward_stage starts from the loss
  // (last stage) or from stage_output_grad(slot), and leaves ∂/∂input in
  // stage_input_grad(slot) (not on the first stage, which finishes in the embedding).
  // What crosses a boundary: the residual [N, d_res], and under LaX the seven latents u
  // [N, r] of the stage's last block, which the next stage's first block crosses with
  // (their gradients flow back the same way).
  //
  // `needed`, when given, is called before forward_stage first reads the parameters of the flat
  // range [0, end): before the embedding, before each block and before the final norm and
  // LM head, and with the buffer's whole length before it returns. A ZeRO trainer waits there
  // for the all-gathers of the updated parameters it started after the last step (Megatron's
  // --overlap-param-gather), so that the later blocks' gathers cross the link while the
  // earlier blocks compute.
  using ParamsNeeded = std::function<void(int64_t end)>;
  void forward_stage(Backend& be, int slot, Tensor tokens, Tensor targets, Tensor loss_sum,
                     const ParamsNeeded& needed = {});
  //
  // `ready`, when given, is called as backward_stage finishes with the gradients of a suffix
  // [begin, end) of the flat buffer: after the LM head and the final norm, after each block
  // (parameters are laid out in model order and each block writes only its own), and after the
  // embedding (begin 0). A data-parallel trainer starts reducing them there while the rest of
  // backward computes (PyTorch DDP's bucket hooks, Megatron's --overlap-grad-reduce).
  using GradsReady = std::function<void(int64_t begin)>;
  // `needed`, when given, is called as forward_stage calls it, before the head's backward and
  // before each block's recomputation and backward: under ZeRO-3 a unit's parameters are
  // gathered for its backward again.
  void backward_stage(Backend& be, int slot, Tensor tokens, Tensor targets, float loss_scale,
                      const GradsReady& ready = {}, const ParamsNeeded& needed = {});
  // The B pass of a split backward (allocate_activations' defer_weight_grads): backward_stage
  // without the projections' and the LM head's weight gradients, which it queues in the slot;
  // the norms', the embedding's and LaX's crossings' gradients are computed here (they come
  // out of the input gradient's own kernels). Calls no `ready`.
  void backward_input_stage(Backend& be, int slot, Tensor tokens, Tensor targets, float loss_scale);
  // The W pass: the slot's queued weight gradients, the head's then each block's from the last,
  // calling `ready` as backward_stage does. They run on the backend their B pass queued them
  // on. The same GEMMs as backward_stage's, so a step's gradients are the same bits when every
  // micro-batch's W runs in micro-batch order.
  void weight_stage(int slot, const GradsReady& ready = {});
  bool defers_weight_grads() const { return defer_weight_grads_; }
  std::vector<Tensor> stage_input(int slot) const;
  std::vector<Tensor> stage_output(int slot) const;
  std::vector<Tensor> stage_output_grad(int slot) const;
  std::vector<Tensor> stage_input_grad(int slot) const;

  // tokens: i32 [B, S]. Returns this rank's logits [B·S, V/t] (vocabulary columns
  // [vocab_first(), vocab_first() + V/t)).
  Tensor forward_logits(Backend& be, Tensor tokens);
  // tokens, targets: i32 [B, S]. Returns the mean cross-entropy (the same on every rank),
  // reading it back from the device: for tools and tests, not the training step.
  float forward(Backend& be, Tensor tokens, Tensor targets);
  // Adds ∂(mean loss)·loss_scale/∂θ into this rank's parameter gradients (+=).
  void backward(Backend& be, Tensor tokens, Tensor targets, float loss_scale = 1.0f);
  // The gradients that accumulate over a step (under ZeRO-2 the kept units' alone: the data-
  // parallel trainer zeroes each slot before its unit's backward).
  void zero_grad(Backend& be) { params_.zero_grads(be); }

  Tensor logits() const { return slots_[0].logits; }  // [B·S, V/t] of the last forward
  size_t activation_bytes() const { return activations_ ? activations_->bytes() : 0; }
  // What this rank's model holds: weights, gradients, activations, communication buffers.
  MemoryBreakdown memory() const;
  int64_t vocab_first() const { return tp_.offset(config_.vocab_size); }

  // Tied embeddings over a pipeline: the first stage's table and the last stage's copy (the
  // LM head) add up their gradients over `group` (those two stages), so both take the same
  // update. A no-op otherwise.
  void reduce_tied_embedding_grad(Communicator* group);
  bool holds_tied_copy() const;  // the last stage's copy of a tied table
  // The flat range [first, second) of the gradients reduce_tied_embedding_grad changes after
  // the pipeline (the tied table on a pipeline's first and last stages; empty otherwise): a
  // reduction started during backward leaves it for later.
  std::pair<int64_t, int64_t> tied_grad_range() const;

  // Σ of squared gradients over the whole model: sharded parameters summed over the TP
  // group, replicated ones counted once. Only the flat range [begin, end) of the gradient
  // buffer counts (a ZeRO-1 shard; end < 0: all of it).
  double grad_sum_squares(Backend& be, int64_t begin = 0, int64_t end = -1) const;
  // The ranges of the gradient buffer that grad_sum_squares sums, for sum_squares_ranges:
  // slot kShardedSlot the sharded parameters' (to be summed over the TP group), kWholeSlot the
  // replicated ones' (counted once). The tied table's copy on the last stage is left out.
  static constexpr int kShardedSlot = 0, kWholeSlot = 1;
  std::vector<SumRange> grad_norm_ranges(int64_t begin = 0, int64_t end = -1) const;

  // Model FLOPs of one forward + backward over `tokens` tokens of sequence length `seq`
  // (the whole model, all ranks together): every GEMM, attention's two over the causal
  // triangle included.
  double flops_per_step(int64_t tokens, int64_t seq) const;

 private:
  void declare_parameters(const ParamSharding& sharding);
  void bind_parameters();
  // What the layout needs to make layer l's block for micro-batches of batch x seq.
  BlockSpec block_spec(int layer, int64_t batch, int64_t seq, Recompute policy) const;

  // The activations of one micro-batch in flight.
  struct Slot {
    // This stage's blocks, made by the layout, bound to the shared parameters.
    std::vector<std::unique_ptr<TpBlock>> blocks;
    // TP overlap (`blocks` empty): each half's blocks, made for B/2 sequences with buffers of
    // their own; a half reads and writes rows [h·N/2, (h+1)·N/2) of the residuals.
    std::array<std::vector<std::unique_ptr<TpBlock>>, 2> halves;
    std::vector<Tensor> residual;    // blocks+1 x [N, d_res]: each block's input, then output
    Tensor whole;                    // [N, d] sharded residual: whole rows at the model's ends
    RMSNorm final_norm;              // last stage
    Tensor logits;                   // [N, V/t] last stage
    VocabParallelCrossEntropy loss;  // last stage
    Tensor output_grad;              // [N, d_res] ∂loss/∂output, from the next stage
    Tensor input_grad;               // [N, d_res] ∂loss/∂input, for the previous stage
    // LaX across a stage boundary: the previous stage's last latents (u, and du for their
    // gradients), which the first block crosses with; and the gradients of this stage's last
    // latents from the next stage.
    BlockLatents boundary;
    std::array<Tensor, kNumProjections> latent_grad_in;  // [N, r] each
    // Split backward: the last stage's gradient of the logits [N, V/t], which the head's
    // weight gradient reads in W; the weight gradients queued by B, per block, then the head's.
    Tensor dlogits;
    std::vector<std::vector<std::function<void()>>> weight_grads;  // [blocks + 1]
  };
  // backward_stage's body: with `defer`, its weight gradients are queued in the slot.
  void run_backward(Backend& be, int slot, Tensor tokens, Tensor targets, float loss_scale,
                    const GradsReady& ready, const ParamsNeeded& needed, bool defer);
  bool crosses_boundaries() const;           // LaX over more than one stage
  size_t stage_blocks(const Slot& s) const;  // the stage's blocks (of each half)
  // TP overlap: one block's passes of both halves, pass(k, half k's TP group), by run_halves.
  void run_in_halves(const std::function<TpTask(int half, const TensorParallel& tp)>& pass) const;

  ModelConfig config_;
  TensorParallel tp_;
  const TpLayout& layout_;  // *tp_.layout
  ModelEnds ends_;          // how the embedding and the LM head meet the blocks
  PipelineStage stage_;
  int first_layer_ = 0, end_layer_ = 0;
  ParameterStore params_;
  Param embedding_, final_norm_weight_, lm_head_;
  // Each block's parameters, by role; every slot's blocks are made from them.
  std::vector<BlockParams> block_params_;
  std::vector<int64_t> block_offsets_;  // [blocks] where each block's parameters begin
  int64_t head_offset_ = 0;             // last stage: where the final norm and LM head begin
  RMSNorm final_norm_;

  bool reserve_only_ = false;
  Backend* memory_ = nullptr;   // where parameters and activations live
  DType compute_ = DType::f32;  // of the weights GEMMs read and of the activations
  int64_t batch_ = 0, seq_ = 0;
  Recompute recompute_ = Recompute::none;
  bool halved_ = false;              // TP overlap: each micro-batch's blocks run as two halves
  bool defer_weight_grads_ = false;  // allocate_activations' defer_weight_grads
  double recompute_seconds_ = 0;
  std::unique_ptr<Arena> activations_, comm_;
  // forward()'s loss, f64 [1] in the model's memory, made on first use (tools and tests; a
  // training step brings its own).
  std::unique_ptr<Arena> scalar_arena_;
  Tensor loss_scalar_;
  Tensor recompute_out_;  // [N, d_res] block: a recomputed block's output, discarded
  std::vector<Slot> slots_;
  Tensor whole_grad_;      // [N, d] ∂/∂(final norm input, whole)
  Tensor gather_scratch_;  // [N·d] sharded residual: the ends' all-gathers (communication)
  Tensor residual_grad_;   // [N, d_res] ∂loss/∂(residual stream at the block being run back)
  Tensor dlogits_;         // [N, V/t]
  Tensor dfinal_;          // [N, d] ∂/∂(final norm output)
};

}  // namespace bottle
