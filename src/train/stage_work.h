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
  // loss_sum: f64 [1] in the backend's memory, which the last stage's forwards add their
  // micro-batches' mean losses to.
  // final_backward: the micro-batch whose backward is the stage's last in the step, during
  // which `ready` hears of the finished gradients (LlamaModel::backward_stage); -1: none.
  // needed: told before each forward reads parameters (LlamaModel::forward_stage).
  TrainStageWork(Backend& be, LlamaModel& model, int slots, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& targets, float loss_scale, Tensor loss_sum,
                 int final_backward = -1, LlamaModel::GradsReady ready = {},
                 LlamaModel::ParamsNeeded needed = {})
      : be_(be),
        model_(model),
        slots_(slots),
        inputs_(inputs),
        targets_(targets),
        loss_scale_(loss_scale),
        loss_sum_(loss_sum),
        final_backward_(final_backward),
        ready_(std::move(ready)),
        needed_(std::move(needed)) {}
  void forward(int m) override {
    const auto t0 = std::chrono::steady_clock::now();
    model_.forward_stage(be_, m % slots_, inputs_[m], targets_[m], loss_sum_, needed_);
    compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  void backward(int m) override {
    const auto t0 = std::chrono::steady_clock::now();
    model_.backward_stage(be_, m % slots_, inputs_[m], targets_[m], loss_scale_,
                          m == final_backward_ ? ready_ : LlamaModel::GradsReady{});
    compute_seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::vector<Tensor> activation_in(int m) override { return model_.stage_input(m % slots_); }
  std::vector<Tensor> activation_out(int m) override { return model_.stage_output(m % slots_); }
  std::vector<Tensor> gradient_in(int m) override { return model_.stage_output_grad(m % slots_); }
  std::vector<Tensor> gradient_out(int m) override { return model_.stage_input_grad(m % slots_); }
  int slots() const override { return slots_; }
  // Host time in forward and backward (on a device backend: issuing their work).
  double compute_seconds = 0.0;

 private:
  Backend& be_;
  LlamaModel& model_;
  int slots_;
  const std::vector<Tensor>& inputs_;
  const std::vector<Tensor>& targets_;
  float loss_scale_;
  Tensor loss_sum_;
  int final_backward_;
  LlamaModel::GradsReady ready_;
  LlamaModel::ParamsNeeded needed_;
};

}  // namespace bottle
