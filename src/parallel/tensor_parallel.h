#pragma once
// The tensor-parallel group a model runs in and the way it splits the model (docs/design.md §4):
//   full     Megatron TP on a full-rank model
//   vanilla  Megatron TP applied to each bottleneck pair (A split along r, B along r)
//   btp      bottleneck-aware TP: chunks end at the r-wide latent, residual stream sharded
#include <array>

#include "comm/communicator.h"

namespace bottle {

enum class TpMode { full, vanilla, btp };
inline constexpr std::array<const char*, 3> kTpModeNames = {"full", "vanilla", "btp"};
inline const char* tp_mode_name(TpMode mode) { return kTpModeNames[int(mode)]; }

// How online RMSNorm's backward gets Σ over the whole hidden of γ ⊙ ∂n ⊙ x per token
// (docs/design.md §5): its own all-reduce of b·s values, or from the chunk's latent, which the
// chunk's backward all-reduce already made whole (no communication; see online_rmsnorm.h).
enum class NormStatistic { from_latent, all_reduce };

class ComponentTimes;

struct TensorParallel {
  TpMode mode = TpMode::vanilla;
  Communicator* comm = nullptr;  // the TP group; null when the model runs on one rank
  bool grouping = true;          // A_q,A_k,A_v (A_gate,A_up) as one GEMM and one collective
  NormStatistic norm_backward = NormStatistic::from_latent;
  // Where vanilla and btp add the compute time of their q/k/v and gate/up groups
  // (component_times.h); null: nothing is timed.
  ComponentTimes* times = nullptr;

  int size() const { return comm ? comm->size() : 1; }
  int rank() const { return comm ? comm->rank() : 0; }
  // This rank's [offset, offset + extent/size) of an extent split evenly.
  int64_t part(int64_t extent) const { return extent / size(); }
  int64_t offset(int64_t extent) const { return part(extent) * rank(); }
};

}  // namespace bottle
