#pragma once
// One optimizer step exactly as `bottle train` takes it, and the forward-only step of its
// validation. `bottle train`, `bench step`, `bench tp` and `bench pipeline` all run this
// code, so every bench times the step that training runs:
//   the step's micro-batches through the pipeline schedule (gradient accumulation, loss
//   scaled by 1/micro-batches) → the tied embedding's gradient over the first and last
//   stage → the DP gradient reduction (or ZeRO-1's reduce-scatter) → the global gradient
//   norm over TP, PP and DP → the non-finite check (training.on_nonfinite) → clipping to
//   training.max_norm → the optimizer (optimizer.name) at the schedule's learning rate →
//   ZeRO-1's all-gather.
#include <array>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/counting_communicator.h"
#include "core/arena.h"
#include "model/llama.h"
#include "pipeline/schedule.h"
#include "train/data_parallel.h"
#include "train/lr_schedule.h"
#include "train/optimizer.h"
#include "train/train_config.h"

namespace bottle {

// What one step did: what `bottle train` logs and the benches report.
struct StepResult {
  double loss = 0.0;       // mean over the step's micro-batches and DP ranks, on every rank
  double grad_norm = 0.0;  // global L2 norm of the averaged gradients, before clipping
  float lr = 0.0f;         // the learning rate of this update
  float clip = 1.0f;       // the factor the gradients were scaled by (1: not clipped)
  bool skipped = false;    // not finite under training.on_nonfinite = "skip": no update
  // Wall times on this rank: the whole step; of it, the pipeline schedule (forward and
  // backward of every micro-batch with the sends and receives between stages); and of that,
  // the time inside forward and backward (the rest of the pipeline's time is waiting).
  double seconds = 0.0, pipeline_seconds = 0.0, compute_seconds = 0.0;
  // Of compute_seconds, each pass's (pipeline/schedule.h's Pass order: F, B, W, BW).
  std::array<double, 4> pass_seconds{};
  // Of the step, the optimizer's update as the host sees it: the update itself on a host
  // backend; on a device, the time to issue it (the device runs it after).
  double optimizer_seconds = 0.0;
};

// Forward only of the micro-batch inputs[0], targets[0] (i32 [B, S]) through `model`'s
// pipeline stage (pp: its pipeline group, null for one stage), in activation slot 0: this
// stage's loss (the last stage's mean cross-entropy; 0 on the others, which the caller's sum
// over the pipeline group adds up). Validation in `bottle train` and `bottle eval`.
// loss_sum: f64 [1] scratch in the backend's memory. needed: as forward_stage's (ZeRO-3
// gathers the units).
double eval_step(Backend& be, LlamaModel& model, Communicator* pp,
                 const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
                 Tensor loss_sum, const LlamaModel::ParamsNeeded& needed = {});

// value (f64 [1] in the backend's memory) = its sum or max over `group`, on the device:
// reduce_scalar's arithmetic (the value travels as f32; unchanged in a group of one) through
// the group's all_reduce of `staging` (f32 [1]), so the host waits for nothing.
void reduce_device_scalar(Backend& be, Communicator* group, Tensor value, Tensor staging,
                          ReduceOp op, std::string_view site);

// The factor clipping scales the gradients by: max_norm / (grad_norm + 1e-6) when the norm
// exceeds max_norm > 0, else 1.
float clip_factor(double grad_norm, double max_norm);

// optimizer.name's optimizer for `model`'s parameters, of which it updates what this rank owns
// under `data_parallel`'s ZeRO.
std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config, const LlamaModel& model,
                                          const DataParallel& data_parallel);

// The learning-rate schedule of a configuration (lr_scheduler.* over training.steps).
LrSchedule lr_schedule_of(const TrainConfig& config);

// The TP mode and group a configuration trains with (parallel.tp_mode and .grouping).
TensorParallel tensor_parallel_of(const TrainConfig& config, Communicator* tp);

// The micro-batches pipeline stage `stage` keeps in flight under the configuration's schedule:
// the activation slots its step allocates (1 without a pipeline).
int pipeline_slots(const TrainConfig& config, int stage);
// How the parameter buffers are cut for parallel.zero over parallel.dp ranks: the ZeRO
// shards' multiple, ZeRO-2's gradient slots, and ZeRO-3's value slots with DP rank
// `dp_rank`'s shard of the masters (any rank's for a plan: they are the same size).
ParamSharding parameter_sharding(const TrainConfig& config, int dp_rank = 0);
// parallel.bucket_mb in bytes, as DataParallel cuts its buckets.
int64_t dp_bucket_bytes(const TrainConfig& config);

// The one split a training step makes of its pipeline group, as a counting group of `pp`
// stages makes it (comm/counting_communicator.h), for a dry run of the step: the tied
// embedding's group of the first and the last stage, which every other stage leaves.
CountingCommunicator::SplitRule tied_embedding_split(int pp);

// A configuration's step as the benches time it: the learning rate held at optimizer.lr (a
// bench's few steps follow no schedule; the rate does not change the work), everything else
// as `bottle train` takes it.
TrainConfig bench_step_config(TrainConfig config);

// Everything one optimizer step touches on this rank: the model of its TP rank and pipeline
// stage, the DP reduction, the optimizer, the learning-rate schedule, the pipeline schedule of
// training.grad_accum_steps micro-batches, and their token buffers.
class TrainStep {
 public:
  // tp: this rank's TP mode and group (tensor_parallel_of(config), or a bench's variant).
  // pp, dp: the pipeline and data-parallel groups (null: one stage, one replica); pp's size
  // must be parallel.pp, dp's parallel.dp. The weights are not initialised (init_weights,
  // load_model_weights or a checkpoint do that), and no activation is allocated until
  // allocate_activations(). Every rank of pp calls it (tied embeddings split the group).
  TrainStep(const TrainConfig& config, Backend& be, TensorParallel tp, Communicator* pp,
            Communicator* dp);

  LlamaModel& model() { return *model_; }
  const LlamaModel& model() const { return *model_; }
  Optimizer& optimizer() { return *optimizer_; }
  const DataParallel& data_parallel() const { return *data_parallel_; }
  DataParallel& data_parallel() { return *data_parallel_; }
  int micro_batches() const { return micro_batches_; }
  int slots() const { return slots_; }  // micro-batches the schedule keeps in flight

  // The activation buffers of the schedule's slots under training.recompute. Called once,
  // after the weights are in place, so that loading a checkpoint and the activations never
  // hold memory at the same time.
  void allocate_activations();

  // The next step's micro-batches, i32 [B, S] each (training.micro_batch_size x seq_len),
  // for the caller to fill: inputs()[m] and targets()[m] (the inputs shifted by one).
  const std::vector<Tensor>& inputs() const { return inputs_; }
  const std::vector<Tensor>& targets() const { return targets_; }

  // One optimizer step on the micro-batches in inputs() and targets(); `step` is 0-based
  // (the learning rate is the schedule's at `step`; messages name step + 1). Fails, naming
  // the step, when the loss or the norm is not finite under training.on_nonfinite = "stop".
  // On a device backend the host waits for the device once, at the end, to read the step's
  // loss and gradient norm: the norm, the non-finite check and clipping happen on the device,
  // and AdamW reads their outcome there.
  StepResult step(int64_t step);
  // True while step() changes the weights and moments: a step that throws meanwhile leaves
  // them neither before nor after it, and they must not be saved as either.
  bool updating() const { return updating_; }
  // True when the last step's loss was not finite: the weights it started from (which a
  // skipped or stopped step leaves as they were) give a non-finite loss.
  bool loss_not_finite() const { return loss_not_finite_; }
  // The bytes the step's scalars take (workspace, beside the token buffers): the memory plan's.
  static size_t scalar_bytes();

  // eval_step of inputs()[0] and targets()[0] on this step's model.
  double eval_step() {
    data_parallel_->finish_gathers();
    DataParallel& data_parallel = *data_parallel_;
    return bottle::eval_step(be_, *model_, pp_, inputs_, targets_, scalar(kEvalLoss),
                             [&data_parallel](int64_t end) { data_parallel.params_needed(end); });
  }

 private:
  bool updating_ = false;
  bool loss_not_finite_ = false;
  const TrainConfig config_;
  Backend& be_;
  Communicator* pp_;
  int micro_batches_ = 1;
  std::vector<Action> actions_;  // this stage's share of the pipeline schedule
  int slots_ = 1;
  int final_backward_ = -1;  // the micro-batch of the stage's last backward in a step
  std::unique_ptr<LlamaModel> model_;
  // Tied embeddings over a pipeline: the first and the last stage, which each hold the table.
  std::unique_ptr<Communicator> embedding_group_;
  std::unique_ptr<DataParallel> data_parallel_;
  std::unique_ptr<Optimizer> optimizer_;
  LrSchedule schedule_;
  // The step's scalars, one f64 each, in the backend's memory (the host reads the first
  // kHostScalars at the step's end).
  enum Scalar { kLoss, kNorm, kSharded, kWhole, kEvalLoss, kScalarCount };
  static constexpr int kHostScalars = 2;  // kLoss and kNorm
  Tensor scalar(Scalar s) const { return scalars_.view(s, {1}); }
  // The gradients after the DP reduction: the flat buffer, or ZeRO-2's shard.
  Tensor reduced_grads() const;

  Arena batch_arena_{MemoryTag::workspace, be_};
  std::vector<Tensor> inputs_, targets_;  // per micro-batch [B, S] i32
  Tensor scalars_;                        // f64 [kScalarCount]
  Tensor control_;                        // f32 [kStepControlSize]: clip factor, apply
  Tensor staging_;                        // f32 [1]: a scalar on its way through a group
  std::vector<SumRange> norm_ranges_;     // of reduced_grads(), for the norm
};

}  // namespace bottle
