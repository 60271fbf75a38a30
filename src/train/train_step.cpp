#include "train/train_step.h"

#include <chrono>
#include <cmath>

#include "pipeline/executor.h"
#include "train/stage_work.h"

namespace bottle {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

double eval_step(Backend& be, LlamaModel& model, Communicator* pp,
                 const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets) {
  const PipelineStage& stage = model.stage();
  TrainStageWork work(be, model, 1, inputs, targets, 0.0f);
  run_pipeline(forward_only_schedule(stage.stages, stage.stage, 1), work, pp);
  return work.loss_sum;
}

double global_grad_norm(Backend& be, const LlamaModel& model, const DataParallel& data_parallel,
                        Communicator* pp) {
  // With ZeRO-1 each DP rank holds the reduced gradients of its shard alone: the shards'
  // squares add up over the DP group. Without it every DP rank holds them all.
  const double sum_squares =
      data_parallel.zero() ? data_parallel.sum(model.grad_sum_squares(be, data_parallel.begin(),
                                                                      data_parallel.end()),
                                               "dp.grad_norm")
                           : model.grad_sum_squares(be);
  // Each stage holds its own parameters: their squared norms add up over the pipeline.
  return std::sqrt(reduce_scalar(pp, sum_squares, ReduceOp::sum, "pp.grad_norm"));
}

float clip_factor(double grad_norm, double max_norm) {
  return max_norm > 0 && grad_norm > max_norm ? float(max_norm / (grad_norm + 1e-6)) : 1.0f;
}

LrSchedule lr_schedule_of(const TrainConfig& config) {
  return LrSchedule{float(config.optimizer.lr), config.lr_scheduler.warmup_steps,
                    config.training.steps, enum_name(config.lr_scheduler.decay),
                    float(config.lr_scheduler.min_lr_ratio)};
}

TensorParallel tensor_parallel_of(const TrainConfig& config, Communicator* tp) {
  return TensorParallel{config.parallel.tp_mode, tp, config.parallel.grouping};
}

int pipeline_slots(const TrainConfig& config, int stage) {
  return peak_in_flight(pipeline_schedule(config.parallel.schedule, int(config.parallel.pp), stage,
                                          int(config.training.grad_accum_steps)));
}

TrainConfig bench_step_config(TrainConfig config) {
  config.lr_scheduler.warmup_steps = 0;
  config.lr_scheduler.decay = LrDecay::constant;
  return config;
}

TrainStep::TrainStep(const TrainConfig& config, Backend& be, TensorParallel tp, Communicator* pp,
                     Communicator* dp)
    : config_(config),
      be_(be),
      pp_(pp),
      micro_batches_(int(config.training.grad_accum_steps)),
      schedule_(lr_schedule_of(config)) {
  const ParallelConfig& p = config.parallel;
  BOTTLE_CHECK((pp ? pp->size() : 1) == p.pp && (dp ? dp->size() : 1) == p.dp,
               "TrainStep: the pipeline and data-parallel groups ({} and {} ranks) are not "
               "parallel.pp = {} and parallel.dp = {}",
               pp ? pp->size() : 1, dp ? dp->size() : 1, p.pp, p.dp);
  const PipelineStage stage{p.pp, pp ? pp->rank() : 0};
  // The micro-batches of a step (gradient accumulation) go through the pipeline schedule.
  actions_ = pipeline_schedule(p.schedule, stage.stages, stage.stage, micro_batches_);
  slots_ = peak_in_flight(actions_);
  BOTTLE_CHECK(config.training.precision == Precision::fp32 || be.bf16_unsupported().empty(),
               "training.precision = \"bf16\" on the {} backend: {}", be.name(),
               be.bf16_unsupported());
  model_ = std::make_unique<LlamaModel>(config.model, tp, p.zero ? p.dp : 1, stage,
                                        /*reserve_only=*/false, be,
                                        compute_dtype(config.training.precision));
  // Tied embeddings: the first and the last stage each hold the table (every pp rank joins
  // the split; the others' group goes unused).
  if (config.model.tie_embeddings && stage.stages > 1)
    embedding_group_ =
        pp->split(stage.first() || stage.last() ? 0 : 1, stage.stage, "tied_embedding");
  data_parallel_ = std::make_unique<DataParallel>(dp, model_->parameters(), p.zero);
  optimizer_ = std::make_unique<AdamW>(model_->parameters(), config.adamw(),
                                       data_parallel_->begin(), data_parallel_->end());
  const int64_t B = config.training.micro_batch_size, S = config.training.seq_len;
  for (int m = 0; m < micro_batches_; ++m) {
    inputs_.push_back(batch_arena_.alloc({B, S}, DType::i32));
    targets_.push_back(batch_arena_.alloc({B, S}, DType::i32));
  }
}

void TrainStep::allocate_activations() {
  model_->allocate_activations(config_.training.micro_batch_size, config_.training.seq_len, slots_,
                               config_.training.recompute);
}

StepResult TrainStep::step(int64_t step) {
  StepResult r;
  const auto t0 = Clock::now();
  model_->zero_grad(be_);
  TrainStageWork work(be_, *model_, slots_, inputs_, targets_, 1.0f / float(micro_batches_));
  const auto pipeline_start = Clock::now();
  run_pipeline(actions_, work, pp_);
  r.pipeline_seconds = seconds_since(pipeline_start);
  r.compute_seconds = work.compute_seconds;
  model_->reduce_tied_embedding_grad(embedding_group_.get());
  // The loss lives on the last stage; every rank learns it.
  const double stage_loss =
      reduce_scalar(pp_, work.loss_sum, ReduceOp::sum, "pp.loss") / double(micro_batches_);
  data_parallel_->reduce_gradients(be_);
  r.loss = data_parallel_->sum(stage_loss, "dp.loss") / data_parallel_->size();
  r.grad_norm = global_grad_norm(be_, *model_, *data_parallel_, pp_);
  r.lr = schedule_.at(step);
  const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  if (!finite && config_.training.on_nonfinite == OnNonfinite::stop)
    fail(
        "step {}: the loss is {} (grad norm {}); stopping (set training.on_nonfinite = \"skip\" "
        "to skip such steps)",
        step + 1, r.loss, r.grad_norm);
  r.skipped = !finite;
  if (finite) {
    r.clip = clip_factor(r.grad_norm, config_.training.max_norm);
    optimizer_->step(be_, model_->parameters(), r.lr, r.clip);
    data_parallel_->gather_parameters(be_);
  }
  // The step ends when its last kernel does (a device backend's run asynchronously).
  be_.synchronize();
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace bottle
