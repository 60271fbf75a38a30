#pragma once
// Runs a schedule's actions (schedule.h) for one stage. Activations and gradients go to
// the same TP rank of the neighbouring stage over the pipeline group, tagged by
// micro-batch; sends are non-blocking, receives wait (the order the schedule's deadlock
// test assumes), and all sends complete before run_pipeline returns.
#include <vector>

#include "comm/communicator.h"
#include "core/tensor.h"
#include "pipeline/schedule.h"

namespace bottle {

// What a stage does for a micro-batch.
class StageWork {
 public:
  virtual ~StageWork() = default;
  virtual void forward(int micro_batch) = 0;
  virtual void backward(int micro_batch) = 0;
  virtual Tensor activation_in(int micro_batch) = 0;   // the previous stage's output lands here
  virtual Tensor activation_out(int micro_batch) = 0;  // sent to the next stage
  virtual Tensor gradient_in(int micro_batch) = 0;     // ∂/∂output from the next stage
  virtual Tensor gradient_out(int micro_batch) = 0;    // ∂/∂input for the previous stage
};

// pp: the pipeline group, this stage being pp->rank() (null: one stage).
void run_pipeline(const std::vector<Action>& actions, StageWork& work, Communicator* pp);

// The forward half of a GPipe schedule (evaluation: no backward).
std::vector<Action> forward_only_schedule(int stages, int stage, int micro_batches);

}  // namespace bottle
