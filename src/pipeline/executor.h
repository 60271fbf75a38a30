#pragma once
// Runs a schedule's actions (schedule.h) for one stage. Activations and gradients go to
// the same TP rank of the neighbouring stage over the pipeline group, tagged by
// micro-batch; sends are non-blocking, and all sends complete before run_pipeline returns.
// Receives are posted ahead (Communicator::start_recv): each as soon as its buffer is free —
// the slot of micro-batch m is micro-batch m − slots' until that one's backward ends — and in
// the schedule's order, so that the message crosses the link while the stage computes; the
// schedule's receive action then only waits for it (where the order the schedule's deadlock
// test assumes still holds).
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "pipeline/schedule.h"

namespace bottle {

// What a stage does for a micro-batch. What crosses a stage boundary may be several
// tensors (the residual, and LaX's latents for the next block's crossing); the n-th tensor
// sent pairs with the n-th received.
class StageWork {
 public:
  virtual ~StageWork() = default;
  virtual void forward(int micro_batch) = 0;
  virtual void backward(int micro_batch) = 0;
  virtual std::vector<Tensor> activation_in(int micro_batch) = 0;   // the previous stage's output
  virtual std::vector<Tensor> activation_out(int micro_batch) = 0;  // for the next stage
  virtual std::vector<Tensor> gradient_in(int micro_batch) = 0;     // ∂/∂output from the next
  virtual std::vector<Tensor> gradient_out(int micro_batch) = 0;    // ∂/∂input for the previous
  // Micro-batch m's buffers are slot m % slots(): free again once micro-batch m − slots()'s
  // backward has run.
  virtual int slots() const = 0;
};

// pp: the pipeline group, this stage being pp->rank() (null: one stage).
void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp);

// The forward half of a GPipe schedule (evaluation: no backward).
std::vector<Action> forward_only_schedule(int stages, int stage, int micro_batches);

}  // namespace bottle
