#pragma once
// The tensor-parallel group a model runs in and the TP mode's layout that splits the model
// over it (docs/design.md §4; the modes are registered in tp_layouts.cpp).
#include <array>
#include <functional>
#include <vector>

#include "comm/communicator.h"

namespace bottle {

// How online RMSNorm's backward gets Σ over the whole hidden of γ ⊙ ∂n ⊙ x per token
// (docs/design.md §5): its own all-reduce of b·s values, or from the chunk's latent, which the
// chunk's backward all-reduce already made whole (no communication; see online_rmsnorm.h).
// parallel.norm_statistic chooses; the default is the mechanism's (BOOST §4.2), the other its
// alternative, kept to compare against (`bench tp --variants`).
enum class NormStatistic { from_latent, all_reduce };
// parallel.norm_statistic's spelling of each, in the enum's order.
inline constexpr std::array<const char*, 2> kNormStatisticNames = {"latent", "all_reduce"};

// Where a tensor-parallel backward puts an input gradient's collective (parallel.tp_backward).
// `async` is Megatron-Core's order (LinearWithGradAccumulationAndAsyncCommunication): the
// collective starts as soon as the input gradient is computed and travels while the layer's
// weight gradient is (MPI: on the group's communication thread; NCCL: on its stream), waited
// for after it. `serial` runs it after the weight gradient, blocking: bottle's order before,
// kept to measure what the overlap buys (`bench tp --tp-backward`). The same bits either way:
// the weight gradient reads neither the input gradient nor what the collective writes.
enum class TpBackward { async, serial };
inline constexpr std::array<const char*, 2> kTpBackwardNames = {"async", "serial"};

// The phase of the TP group's stats while a model runs a W pass (LlamaModel::weight_stage): a
// dry run counts its kernels apart, so that the planner prices W from them.
inline constexpr const char* kWeightPassPhase = "weight.";

class TpLayout;
struct TpHalf;

struct TensorParallel {
  // The TP mode: how the model is split (tp_layout.h). No default: a model needs one, and
  // parallel.tp_mode's default depends on the model (default_tp_layout in tp_layouts.h).
  const TpLayout* layout = nullptr;
  Communicator* comm = nullptr;  // the TP group; null when the model runs on one rank
  // A_q,A_k,A_v (A_gate,A_up) as one GEMM and one collective. The one default of
  // parallel.grouping (train/train_config.h takes it from here).
  bool grouping = true;
  NormStatistic norm_backward = NormStatistic::from_latent;
  // The one default of parallel.tp_backward: the best order each mode has.
  TpBackward backward = TpBackward::async;
  // TP overlap (parallel.tp_overlap): the model runs each micro-batch's blocks as two halves
  // (LlamaModel). Off by default: it changes the parameter gradients' rounding, and halving
  // a GEMM costs efficiency where communication is cheap.
  bool overlap = false;
  // Under TP overlap, the half (of the micro-batch's rows) whose pass this is, which its
  // collectives suspend (tp_overlap.h); null: the pass runs serially, its collectives blocking.
  TpHalf* half = nullptr;
  // Zero-bubble schedules (pipeline/schedule.h, pass W): the block's weight gradients are
  // queued here in the B pass, to run in the W pass (Megatron's WeightGradStore); null: they
  // run where they are met. What a queued gradient reads stays untouched until then: the
  // model keeps each block's gradient buffers and a copy of the residual's gradient it read
  // (LlamaModel::allocate_activations, defer_weight_grads).
  std::vector<std::function<void()>>* weight_grads = nullptr;

  // Runs a weight gradient now, or queues it for the W pass. `fn` owns what it names (copies
  // of tensors and pointers to the block's own objects): it may run after the pass returns.
  void weight_grad(std::function<void()> fn) const {
    if (weight_grads)
      weight_grads->push_back(std::move(fn));
    else
      fn();
  }

  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
  // This rank's [offset, offset + extent/size) of an extent split evenly.
  int64_t part(int64_t extent) const { return extent / size(); }
  int64_t offset(int64_t extent) const { return part(extent) * rank(); }
};

}  // namespace bottle
