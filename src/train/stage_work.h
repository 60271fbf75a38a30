#pragma once
// One pipeline stage's share of a training step, for the schedule executor
// (pipeline/executor.h): micro-batch m runs in activation slot m % slots, which a schedule
// keeping at most `slots` micro-batches alive has freed by then.
#include <array>
#include <chrono>
#include <functional>
#include <vector>

#include "core/error.h"
#include "model/llama.h"
#include "pipeline/executor.h"

namespace bottle {

// What a stage's forward and backward tell the data-parallel trainer (DataParallel).
struct StageHooks {
  // The micro-batch whose backward is the stage's last in the step (its gradients are then
  // final); -1: none.
  int final_backward = -1;
  // `ready` hears the gradients of every backward (ZeRO-2 reduces each micro-batch's), not
  // only the final one's.
  bool every_backward = false;
  std::function<void(bool final)> backward_begins{};  // before each backward
  LlamaModel::GradsReady ready{};                     // LlamaModel::backward_stage
  LlamaModel::ParamsNeeded needed{};                  // LlamaModel::forward_stage
  LlamaModel::ParamsNeeded needed_backward{};         // LlamaModel::backward_stage (ZeRO-3)
};

class TrainStageWork final : public StageWork {
 public:
  // loss_sum: f64 [1] in the backend's memory, which the last stage's forwards add their
  // micro-batches' mean losses to.
  TrainStageWork(Backend& be, LlamaModel& model, int slots, const std::vector<Tensor>& inputs,
                 const std::vector<Tensor>& targets, float loss_scale, Tensor loss_sum,
                 StageHooks hooks = {})
      : be_(be),
        model_(model),
        slots_(slots),
        inputs_(inputs),
        targets_(targets),
        loss_scale_(loss_scale),
        loss_sum_(loss_sum),
        hooks_(std::move(hooks)) {}
  // Chunk 0 only (schedule_unrunnable in train_config.h refuses interleaved lists at
  // configuration load, so these checks only catch a caller that skipped it).
  void forward(int m, int chunk) override {
    check_chunk(chunk);
    const auto t0 = std::chrono::steady_clock::now();
    model_.forward_stage(be_, m % slots_, inputs_[m], targets_[m], loss_sum_, hooks_.needed);
    add_time(Pass::F, t0);
  }
  void backward(int m, int chunk) override {
    check_chunk(chunk);
    const auto t0 = std::chrono::steady_clock::now();
    model_.backward_stage(be_, m % slots_, inputs_[m], targets_[m], loss_scale_,
                          gradients_written(m), hooks_.needed_backward);
    add_time(Pass::BW, t0);
  }
  // A split backward (LlamaModel::allocate_activations' defer_weight_grads): B computes the
  // input gradients the previous stage waits for, W later the weight gradients, which are then
  // final after the last micro-batch's W.
  void backward_input(int m, int chunk) override {
    check_chunk(chunk);
    const auto t0 = std::chrono::steady_clock::now();
    model_.backward_input_stage(be_, m % slots_, inputs_[m], targets_[m], loss_scale_);
    add_time(Pass::B, t0);
  }
  void backward_weight(int m, int chunk) override {
    check_chunk(chunk);
    const auto t0 = std::chrono::steady_clock::now();
    model_.weight_stage(m % slots_, gradients_written(m));
    add_time(Pass::W, t0);
  }
  std::vector<Tensor> activation_in(int m, int chunk) override {
    check_chunk(chunk);
    return model_.stage_input(m % slots_);
  }
  std::vector<Tensor> activation_out(int m, int chunk) override {
    check_chunk(chunk);
    return model_.stage_output(m % slots_);
  }
  std::vector<Tensor> gradient_in(int m, int chunk) override {
    check_chunk(chunk);
    return model_.stage_output_grad(m % slots_);
  }
  std::vector<Tensor> gradient_out(int m, int chunk) override {
    check_chunk(chunk);
    return model_.stage_input_grad(m % slots_);
  }
  int slots() const override { return slots_; }
  // Host time in forward and backward (on a device backend: issuing their work), and of it
  // each pass's (Pass's order: F, B, W, BW).
  double compute_seconds = 0.0;
  std::array<double, 4> pass_seconds{};

 private:
  // Before the pass that writes micro-batch m's weight gradients (BW or W): tells DP it begins,
  // and returns the hook that hears them where DP wants them (the final backward's, or every
  // one's).
  LlamaModel::GradsReady gradients_written(int m) {
    const bool final = m == hooks_.final_backward;
    if (hooks_.backward_begins) hooks_.backward_begins(final);
    return final || hooks_.every_backward ? hooks_.ready : LlamaModel::GradsReady{};
  }
  void add_time(Pass pass, std::chrono::steady_clock::time_point start) {
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    compute_seconds += seconds;
    pass_seconds[size_t(pass)] += seconds;
  }
  static void check_chunk(int chunk) {
    BOTTLE_ASSERT(chunk == 0, "pipeline: the model runs one chunk per stage, not chunk {}", chunk);
  }

  Backend& be_;
  LlamaModel& model_;
  int slots_;
  const std::vector<Tensor>& inputs_;
  const std::vector<Tensor>& targets_;
  float loss_scale_;
  Tensor loss_sum_;
  StageHooks hooks_;
};

}  // namespace bottle
