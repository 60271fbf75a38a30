#pragma once
// A tensor-parallel mode's layout (docs/design.md §4, §17), as Megatron's layer specs and
// TorchTitan's sharding plans state one: a description of which dimension of every parameter
// it splits, the widths a rank holds, how the embedding and the LM head meet the blocks, what
// the model must satisfy and which recomputation policies apply, and the factory of its
// blocks (tp_block.h), which own their passes. Each mode is one file holding its layout and
// its block, beside its communication: tp_full.cpp, tp_vanilla.cpp, tp_btp.cpp. The registry
// (tp_layouts.h) maps a mode's name to its layout; src/model asks the layout and never the
// mode's name.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/setting_error.h"
#include "nn/model_shape.h"
#include "parallel/recompute.h"
#include "parallel/tensor_parallel.h"
#include "parallel/tp_block.h"

namespace bottle {

// The dimension of each parameter a layout splits evenly over the TP group (a rank holds
// [i·e/t, (i+1)·e/t) of it); kWhole: the whole parameter on every rank.
inline constexpr int kWhole = -1;
constexpr std::array<int, kNumProjections> whole_projections() {
  std::array<int, kNumProjections> dims{};
  dims.fill(kWhole);
  return dims;
}
struct ParameterSplits {
  // The first stage's table [V, d]: 0 vocabulary rows, 1 hidden columns (exactly when
  // ModelEnds::hidden_split_embedding).
  int embedding = kWhole;
  int block_norm = kWhole;  // RMSNorm₁'s and RMSNorm₂'s γ [d]
  std::array<int, kNumProjections> weight = whole_projections();  // full-rank W [d_out, d_in]
  std::array<int, kNumProjections> A = whole_projections();       // bottleneck A [r, d_in]
  std::array<int, kNumProjections> B = whole_projections();       // and B [d_out, r]
  int lax_crossing = kWhole;  // LaX's G [r, r] and LN_r's weight and bias [r]
  int final_norm = kWhole;    // [d]
  // [V, d], also the last stage's copy of a tied table. The loss is vocabulary-parallel
  // (vocab_parallel.h): 0, whatever the mode.
  int lm_head = kWhole;
};

// How the model's ends meet the blocks (docs/design.md §4 "Embedding, LM head and loss").
struct ModelEnds {
  // The blocks read and leave the residual split by hidden columns ([N, d/t] per rank): the
  // last stage all-gathers whole rows [N, d] before the final norm (and scatters their
  // gradient back), and a first stage whose table is split by vocabulary rows keeps its own
  // columns of the embedding's whole rows (and all-gathers their gradient).
  bool sharded_residual = false;
  // The first stage's table is split by hidden columns [V, d/t]: each rank looks up its own
  // residual shard, no communication either way. Otherwise by vocabulary rows [V/t, d]: each
  // rank looks up the rows it holds and one all-reduce of N·d sums them.
  bool hidden_split_embedding = false;
};

// The widths of one projection on this rank (nn/projection.h).
struct ProjectionDims {
  int64_t d_in = 0, d_out = 0;               // this rank's input and output widths
  int64_t rank = 0;                          // the latent the latent stage runs on
  int64_t shard_rank = 0, shard_offset = 0;  // latent columns A and B hold (0: all of it)
};

// A projection group that a profile shows apart (BOOST §4.3's grouping ablation times the
// q/k/v and gate/up groups): its ops run inside a backend range of its name
// (Backend::push_range), and these are the call sites of its collectives, forward and
// backward, with grouping (one for the group) and without (one per member); a recomputation's
// carry kRecomputePhase in front.
struct TpComponent {
  const char* name;  // its range: "qkv", "gate_up"
  std::vector<std::string> sites;
};

class TpLayout {
 public:
  virtual ~TpLayout() = default;

  // parallel.tp_mode's value: "full", "vanilla", "btp".
  virtual const char* name() const = 0;

  // --- What the model must satisfy.
  // Whether the layout splits models of this bottleneck kind.
  virtual bool fits(BottleneckKind kind) const = 0;
  // What fits() asks, completing "tp_mode is \"x\", which …": "needs a bottleneck model".
  virtual const char* requirement() const = 0;
  // Throws SettingError(Setting::tp) when `t` does not divide a dimension this layout splits.
  virtual void check_divisible(const ModelShape& model, int t) const = 0;
  // Whether the recomputation policy applies to this layout and model (recompute.h).
  virtual bool supports(Recompute policy, const ModelShape& model) const = 0;
  // Why a policy that supports() refuses does not apply, completing "under \"x\" …".
  virtual const char* why_not(Recompute policy) const = 0;

  // --- How the model is split over t ranks.
  virtual ParameterSplits parameter_splits(const ModelShape& model) const = 0;
  virtual ModelEnds ends(const ModelShape& model) const = 0;
  // The TP widths of a block on each of t ranks: d, d_res, heads, kv_heads, head_dim, dq,
  // dkv, dff (the block adds batch, seq, rope_theta and gate_act from its BlockSpec).
  virtual BlockDims block_dims(const ModelShape& model, int t) const = 0;
  virtual ProjectionDims projection_dims(const ModelShape& model, ProjectionId p, int t,
                                         int tp_rank) const = 0;

  // --- Its blocks.
  // The block of `spec` for this mode, bound to spec.params with this mode's widths, its
  // buffers taken from `a` (those spec.policy keeps from a.kept). It runs its own forward,
  // backward and recomputation with every collective they issue.
  virtual std::unique_ptr<TpBlock> make_block(const BlockSpec& spec,
                                              const BlockAllocators& a) const = 0;
  // The groups its blocks time apart; none by default (full's blocks time none).
  virtual std::vector<TpComponent> components() const { return {}; }
};

// Throws SettingError: naming the TP mode when `layout` does not fit the model, the TP degree
// when t does not divide a dimension it splits.
void validate_layout(const TpLayout& layout, const ModelShape& model, int t);
// Throws SettingError naming the recomputation policy when it does not apply to the layout
// and model.
void validate_recompute(Recompute policy, const TpLayout& layout, const ModelShape& model);

// Throws SettingError(Setting::tp) naming `what` unless t divides `value`.
void require_divides(int t, int64_t value, Setting what);

}  // namespace bottle
