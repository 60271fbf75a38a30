#pragma once
// The optimizer interface (docs/design.md §9), in the shape of TorchTitan's
// OptimizersContainer: an optimizer steps the parameters routed to it by their role and owns
// named state tensors (AdamW's "exp_avg" and "exp_avg_sq", Muon's "momentum_buffer"), each
// held as flat sources laid out like the parameter buffer (model/sharded_checkpoint.h). The
// checkpoint store, the trainer's non-finite scan, the memory plan and `inspect` iterate that
// state and never name an optimizer's tensors.
#include <cstdint>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "model/parameters.h"
#include "model/sharded_checkpoint.h"

namespace bottle {

// What a parameter is to the optimizers, from its name and shape (the HF names of
// model/llama.cpp): the routing table of docs/design.md §9 sends `matrix` to Muon under
// optimizer.name = "muon" and everything to AdamW otherwise.
enum class ParamRole {
  matrix,     // a 2-D weight of a block: a full-rank projection, a bottleneck factor, LaX's G
  embedding,  // the token table (also the last pipeline stage's copy of a tied one)
  lm_head,    // an untied LM head
  vector,     // a 1-D parameter: a norm's weight, LaX's LN_r weight and bias
};
ParamRole param_role(const ParamSpec& spec);
const char* param_role_name(ParamRole role);

// The phase (Communicator::set_phase) of the TP and DP groups while the optimizer steps: its
// collectives' sites read "optimizer.tp.muon_gram", and a dry run counts its kernels apart, as
// the step's tail (`bottle plan`).
inline constexpr const char* kOptimizerPhase = "optimizer.";

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Its optimizer.name, as a checkpoint records it.
  virtual const char* name() const = 0;
  // Update steps_taken() + 1 of every parameter this rank owns with learning rate `lr`, writing
  // the compute copy (the bf16 weights of a mixed-precision run). control: the step's control
  // tensor (Backend::clip_and_check) in the backend's memory, which scales the gradients
  // (clipping) and skips a non-finite step on the device. grad_shard: [shard] the owned
  // gradients end to end (ZeRO-2), read instead of the store's flat buffer. The gradients of
  // the parameters an optimizer owns may be overwritten: the step is their last reader.
  virtual void step(Backend& be, const ParameterStore& params, float lr, Tensor control,
                    Tensor grad_shard = {}) = 0;
  // The state held on this rank, in bytes.
  virtual size_t bytes() const = 0;
  // The state as a checkpoint names it ("exp_avg/", "momentum_buffer/", ...), each with what
  // this rank holds of it: a sharded checkpoint writes and reads them in place.
  virtual std::vector<FlatSource> held_state() const = 0;

  // The host counts a step once it knows the step was taken (not skipped).
  void count_step() { ++steps_; }
  int64_t steps_taken() const { return steps_; }
  void set_steps_taken(int64_t steps) { steps_ = steps; }

 private:
  int64_t steps_ = 0;
};

// source's held stretches ← those of `whole` [padded count], a tensor laid out like the whole
// parameter buffer (a checkpoint's state read whole, as checkpoints before the sharded format
// hold it).
void take_held(Backend& be, const FlatSource& source, Tensor whole);

}  // namespace bottle
