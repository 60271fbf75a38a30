#pragma once
// Activation recomputation (docs/design.md §7, low-rank activation checkpointing): what a block
// keeps from its forward pass for its backward, and how the rest comes back.
//   none     every buffer of every block is kept.
//   block    only the block's input (the residual) is kept; backward re-runs the whole
//            block forward first, collectives included (under full and vanilla TP that is
//            the block's all-reduces again; under btp its four).
//   lowrank  btp (or one rank) on a bottleneck model: only chunk-boundary tensors are kept,
//            the r-wide latents after each all-reduce (with the RMSNorm statistics they
//            carry) and the sharded residual after attention; backward rebuilds each
//            chunk's inside from them (B, attention, SwiGLU, σ, the local part of the
//            online RMSNorm) and never issues a collective.
// LaX's latents u and their gradients du cross into the next block, so every policy keeps
// them per block. What is not kept lives in one region that all blocks and micro-batches
// share: it holds one block at a time.
#include <array>

namespace bottle {

enum class Recompute { none, block, lowrank };
inline constexpr std::array<const char*, 3> kRecomputeNames = {"none", "block", "lowrank"};
inline const char* recompute_name(Recompute policy) { return kRecomputeNames[int(policy)]; }
// What a policy keeps, completing "\"lowrank\" keeps …": a model without it cannot use it.
inline const char* recompute_keeps(Recompute policy) {
  switch (policy) {
    case Recompute::none:
      return "every activation";
    case Recompute::block:
      return "each block's input";
    case Recompute::lowrank:
      return "the r-wide latents of a bottleneck model";
  }
  return "";
}

// Collectives issued while a block is recomputed count under this site prefix, and its ops
// under this backend range (Backend::push_range): a profile shows recomputation apart.
inline constexpr const char* kRecomputePhase = "recompute.";
inline constexpr const char* kRecomputeRange = "recompute";

}  // namespace bottle
