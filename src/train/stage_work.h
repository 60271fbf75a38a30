#pragma once
// One pipeline stage's share of a training step, for the schedule executor
// (pipeline/executor.h): micro-batch m runs in activation slot m % slots, which a schedule
// keeping at most `slots` micro-batches alive has freed by then.
#include <chrono>
#include <vector>

#include "model/llama.h"
#include "pipeline/executor.h"

namespace bottle {

class TrainStageWork final : public StageWork {
 public:
  TrainStageWork(Backend& be, LlamaModel& model, int slots, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& targets, float loss_scale)
      : be_(be),
        model_(model),
        slots_(slots),
        inputs_(inputs),
        targets_(targets),
        loss_scale_(loss_scale) {}
  void forward(int m) override {
    const auto t0 = std::chrono::steady_clock::now();
    loss_sum += model_.forward_stage(be_, m % slots_, inputs_[m], targets_[m]);
    compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void backward(int m) override {
    const auto t0 = std::chrono::steady_clock::now();
    model_.backward_stage(be_, m % slots_, inputs_[m], targets_[m], loss_scale_);
    compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::vector<Tensor> activation_in(int m) override { return model_.stage_input(m % slots_); }
  std::vector<Tensor> activation_out(int m) override { return model_.stage_output(m % slots_); }
  std::vector<Tensor> gradient_in(int m) override { return model_.stage_output_grad(m % slots_); }
  std::vector<Tensor> gradient_out(int m) override { return model_.stage_input_grad(m % slots_); }
  double loss_sum = 0.0;         // the last stage's: Σ over micro-batches of their mean loss
  double compute_seconds = 0.0;  // in forward and backward (the rest of a step is waiting)

 private:
  Backend& be_;
  LlamaModel& model_;
  int slots_;
  const std::vector<Tensor>& inputs_;
  const std::vector<Tensor>& targets_;
  float loss_scale_;
};

}  // namespace bottle
