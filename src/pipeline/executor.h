#pragma once
// Runs a schedule's actions (schedule.h) for one stage. Activations and gradients go to the
// same TP rank of the action's peer stage over the pipeline group, tagged by micro-batch, the
// sending chunk and the direction; sends are non-blocking, and all sends complete before
// run_pipeline returns. Receives are posted ahead (Communicator::start_recv): each as soon as
// its buffer is free — the slot of (micro-batch m, chunk c) is (m − slots, c)'s until that
// one's W (or BW) ends — and in the schedule's order, so that the message crosses the link
// while the stage computes; the schedule's receive action then only waits for it.
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "pipeline/schedule.h"

namespace bottle {

// What a stage does for a (micro-batch, chunk). What crosses a stage boundary may be several
// tensors (the residual, and LaX's latents for the next block's crossing); the n-th tensor
// sent pairs with the n-th received.
class StageWork {
 public:
  virtual ~StageWork() = default;
  virtual void forward(int micro_batch, int chunk) = 0;
  virtual void backward(int micro_batch, int chunk) = 0;         // BW: B and W at once
  virtual void backward_input(int micro_batch, int chunk) = 0;   // B: ∂/∂input only
  virtual void backward_weight(int micro_batch, int chunk) = 0;  // W: ∂/∂weights, after B
  // The previous virtual stage's output.
  virtual std::vector<Tensor> activation_in(int micro_batch, int chunk) = 0;
  virtual std::vector<Tensor> activation_out(int micro_batch, int chunk) = 0;  // for the next
  virtual std::vector<Tensor> gradient_in(int micro_batch, int chunk) = 0;     // ∂/∂output
  virtual std::vector<Tensor> gradient_out(int micro_batch, int chunk) = 0;    // ∂/∂input
  // (micro-batch m, chunk c)'s buffers are slot m % slots() of chunk c: free again once
  // (m − slots(), c)'s W or BW has run.
  virtual int slots() const = 0;
};

// pp: the pipeline group, this stage being pp->rank() (null: one stage). Every stage's list
// must run the same chunks (the tags count them).
void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp);

// The forward half of a GPipe schedule (evaluation: no backward).
std::vector<Action> forward_only_schedule(int stages, int stage, int micro_batches);

}  // namespace bottle
