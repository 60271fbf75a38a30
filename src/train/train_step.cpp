#include "train/train_step.h"

#include <algorithm>
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

void complete_collectives(std::initializer_list<Communicator*> groups) {
  for (Communicator* group : groups)
    if (group) group->complete();
}

}  // namespace

double eval_step(Backend& be, LlamaModel& model, Communicator* pp,
                 const std::vector<Tensor>& inputs, const std::vector<Tensor>& targets,
                 Tensor loss_sum, const LlamaModel::ParamsNeeded& needed) {
  const PipelineStage& stage = model.stage();
  be.fill_zero(loss_sum);
  TrainStageWork work(be, model, 1, inputs, targets, 0.0f, loss_sum, StageHooks{.needed = needed});
  run_pipeline(forward_only_schedule(stage.stages, stage.stage, 1), work, pp);
  complete_collectives({model.tensor_parallel().comm, pp});
  double loss = 0.0;
  if (stage.last()) be.to_host(&loss, loss_sum);
  return loss;
}

void reduce_device_scalar(Backend& be, Communicator* group, Tensor value, Tensor staging,
                          ReduceOp op, std::string_view site) {
  if (!group || group->size() == 1) return;
  be.copy(staging, value);
  group->all_reduce(staging, op, site);
  be.copy(value, staging);
}

size_t TrainStep::scalar_bytes() {
  // As the constructor allocates them: the scalars, the control tensor, the staging float.
  return aligned_size(size_t(kScalarCount) * sizeof(double)) +
         aligned_size(kStepControlSize * sizeof(float)) + aligned_size(sizeof(float));
}

float clip_factor(double grad_norm, double max_norm) {
  return max_norm > 0 && grad_norm > max_norm ? float(max_norm / (grad_norm + 1e-6)) : 1.0f;
}

LrSchedule lr_schedule_of(const TrainConfig& config) {
  return LrSchedule{float(config.optimizer.lr), config.lr_scheduler.warmup_steps,
                    config.training.steps, config.lr_scheduler.decay,
                    float(config.lr_scheduler.min_lr_ratio)};
}

TensorParallel tensor_parallel_of(const TrainConfig& config, Communicator* tp) {
  return TensorParallel{.layout = config.parallel.tp_mode,
                        .comm = tp,
                        .grouping = config.parallel.grouping,
                        .norm_backward = config.parallel.norm_statistic,
                        .backward = config.parallel.tp_backward,
                        .overlap = config.parallel.tp_overlap};
}

int pipeline_slots(const TrainConfig& config, int stage) {
  return peak_in_flight(pipeline_schedule(config.parallel.schedule, int(config.parallel.pp), stage,
                                          int(config.training.grad_accum_steps),
                                          config.parallel.virtual_stages));
}

ParamSharding parameter_sharding(const TrainConfig& config, int dp_rank) {
  const ParallelConfig& p = config.parallel;
  if (p.zero == 0 || p.dp == 1) return {};
  ParamSharding sharding{p.dp, p.zero >= 2};
  sharding.value_slots = p.zero >= 3;
  sharding.rank = dp_rank;
  sharding.bucket = DataParallel::bucket_elements(dp_bucket_bytes(config), int(p.dp));
  return sharding;
}

int64_t dp_bucket_bytes(const TrainConfig& config) {
  // At most a petabyte: one bucket.
  return int64_t(std::min(config.parallel.bucket_mb, 1e9) * 1048576.0);
}

CountingCommunicator::SplitRule tied_embedding_split(int pp) {
  // TrainStep's colors: 0 for the first and the last stage (keys 0 and pp − 1), 1 for the rest.
  return [pp](int color, int key) {
    using Group = CountingCommunicator::SplitGroup;
    return color == 0 ? Group{2, key == 0 ? 0 : 1, 0, pp - 1}
                      : Group{pp - 2, std::max(0, key - 1), 1, 1};
  };
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
  BOTTLE_ASSERT((pp ? pp->size() : 1) == p.pp && (dp ? dp->size() : 1) == p.dp,
                "TrainStep: the pipeline and data-parallel groups ({} and {} ranks) are not "
                "parallel.pp = {} and parallel.dp = {}",
                pp ? pp->size() : 1, dp ? dp->size() : 1, p.pp, p.dp);
  const PipelineStage stage{p.pp, pp ? pp->rank() : 0};
  // The micro-batches of a step (gradient accumulation) go through the pipeline schedule.
  BOTTLE_CHECK(schedule_refusal(config).empty(), "TrainStep: {}", schedule_refusal(config));
  actions_ =
      pipeline_schedule(p.schedule, stage.stages, stage.stage, micro_batches_, p.virtual_stages);
  slots_ = peak_in_flight(actions_);
  BOTTLE_CHECK(config.training.precision == Precision::fp32 || be.bf16_unsupported().empty(),
               "training.precision = \"bf16\" on the {} backend: {}", be.name(),
               be.bf16_unsupported());
  model_ = std::make_unique<LlamaModel>(
      config.model, tp, parameter_sharding(config, dp ? dp->rank() : 0), stage,
      /*reserve_only=*/false, be, compute_dtype(config.training.precision));
  // Tied embeddings: the first and the last stage each hold the table (every pp rank joins
  // the split; the others' group goes unused).
  if (config.model.tie_embeddings && stage.stages > 1)
    embedding_group_ =
        pp->split(stage.first() || stage.last() ? 0 : 1, stage.stage, "tied_embedding");
  data_parallel_ = std::make_unique<DataParallel>(
      dp, model_->parameters(),
      DataParallel::Options{.zero = p.zero,
                            .overlap_grad_reduce = p.overlap_grad_reduce,
                            .overlap_param_gather = p.overlap_param_gather,
                            .held = model_->tied_grad_range(),
                            .bucket_bytes = dp_bucket_bytes(config),
                            .first_unit_forward_only = stage.first()});
  // The stage's last backward of a step: the one after which its gradients are final (a W
  // pass, or BW, writes them).
  for (const Action& a : actions_)
    if (a.kind == ActionKind::compute && (a.pass == Pass::BW || a.pass == Pass::W))
      final_backward_ = a.micro_batch;
  optimizer_ = make_optimizer(config, *model_, *data_parallel_);
  const int64_t B = config.training.micro_batch_size, S = config.training.seq_len;
  for (int m = 0; m < micro_batches_; ++m) {
    inputs_.push_back(batch_arena_.alloc({B, S}, DType::i32));
    targets_.push_back(batch_arena_.alloc({B, S}, DType::i32));
  }
  scalars_ = batch_arena_.alloc({kScalarCount}, DType::f64);
  control_ = batch_arena_.alloc({kStepControlSize});
  staging_ = batch_arena_.alloc({1});
  // The gradients this rank holds reduced: its slices under ZeRO, all of them without;
  // under ZeRO-2 at their places in the gradient shard, which lays the slices end to end.
  int64_t local = 0;
  for (const ElementRange& r : data_parallel_->shard().ranges()) {
    for (SumRange sum : model_->grad_norm_ranges(r.offset, r.offset + r.count)) {
      if (data_parallel_->shards_gradients()) sum.offset += local - r.offset;
      norm_ranges_.push_back(sum);
    }
    local += r.count;
  }
}

std::unique_ptr<Optimizer> make_optimizer(const TrainConfig& config, const LlamaModel& model,
                                          const DataParallel& data_parallel) {
  switch (config.optimizer.name) {
    case OptimizerKind::muon:
      return std::make_unique<Muon>(model.parameters(), config.muon(), config.adamw(),
                                    model.tensor_parallel().comm, data_parallel.shard(),
                                    data_parallel.zero() ? data_parallel.group() : nullptr);
    case OptimizerKind::adamw:
      break;
  }
  return std::make_unique<AdamW>(model.parameters(), config.adamw(), data_parallel.shard());
}

Tensor TrainStep::reduced_grads() const {
  return data_parallel_->shards_gradients() ? data_parallel_->grad_shard()
                                            : model_->parameters().grads();
}

void TrainStep::allocate_activations() {
  // A schedule with W passes runs each backward as B, then W later (LlamaModel's split).
  model_->allocate_activations(config_.training.micro_batch_size, config_.training.seq_len, slots_,
                               config_.training.recompute,
                               schedule_info(config_.parallel.schedule).splits_weight_pass);
}

StepResult TrainStep::step(int64_t step) {
  StepResult r;
  const auto t0 = Clock::now();
  model_->zero_grad(be_);
  be_.fill_zero(scalars_);
  DataParallel& data_parallel = *data_parallel_;
  Backend& be = be_;
  TrainStageWork work(
      be_, *model_, slots_, inputs_, targets_, 1.0f / float(micro_batches_), scalar(kLoss),
      StageHooks{.final_backward = final_backward_,
                 .every_backward = data_parallel.shards_gradients(),
                 .backward_begins = [&data_parallel,
                                     &be](bool final) { data_parallel.backward_begins(be, final); },
                 .ready = [&data_parallel](int64_t begin) { data_parallel.grads_ready(begin); },
                 .needed = [&data_parallel](int64_t end) { data_parallel.params_needed(end); },
                 .needed_backward =
                     [&data_parallel](int64_t end) { data_parallel.params_needed_backward(end); }});
  const auto pipeline_start = Clock::now();
  run_pipeline(actions_, work, pp_);
  r.pipeline_seconds = seconds_since(pipeline_start);
  r.compute_seconds = work.compute_seconds;
  r.pass_seconds = work.pass_seconds;
  model_->reduce_tied_embedding_grad(embedding_group_.get());
  // The loss lives on the last stage; every rank learns it. Everything from here to the
  // update stays on the device, in the order and the arithmetic the host used to do it in.
  Communicator* dp = data_parallel_->group();
  reduce_device_scalar(be_, pp_, scalar(kLoss), staging_, ReduceOp::sum, "pp.loss");
  be_.scalar_divide(scalar(kLoss), scalar(kLoss), double(micro_batches_));
  data_parallel_->reduce_gradients(be_);
  reduce_device_scalar(be_, dp, scalar(kLoss), staging_, ReduceOp::sum, "dp.loss");
  be_.scalar_divide(scalar(kLoss), scalar(kLoss), double(data_parallel_->size()));
  // The global gradient norm (docs/design.md §9): each parameter counted once over the TP, PP
  // and DP groups. With ZeRO each DP rank holds the reduced gradients of its slices alone:
  // the shards' squares add up over the DP group; without it every DP rank holds them all.
  // Each stage holds its own parameters: their squares add up over the pipeline.
  be_.sum_squares_ranges(scalars_.view(kSharded, {2}), reduced_grads(), norm_ranges_);
  reduce_device_scalar(be_, model_->tensor_parallel().comm, scalar(kSharded), staging_,
                       ReduceOp::sum, "tp.grad_norm");
  be_.scalar_add(scalar(kNorm), scalar(kSharded), scalar(kWhole));
  if (data_parallel_->zero())
    reduce_device_scalar(be_, dp, scalar(kNorm), staging_, ReduceOp::sum, "dp.grad_norm");
  reduce_device_scalar(be_, pp_, scalar(kNorm), staging_, ReduceOp::sum, "pp.grad_norm");
  be_.scalar_sqrt(scalar(kNorm), scalar(kNorm));
  // The non-finite check and the clip factor, read by AdamW on the device: a non-finite step
  // changes nothing there, whatever the host decides once it reads the scalars.
  const double max_norm = config_.training.max_norm;
  be_.clip_and_check(control_, scalar(kLoss), scalar(kNorm), max_norm);
  r.lr = schedule_.at(step);
  updating_ = true;
  {
    const CommPhase tp_phase(model_->tensor_parallel().comm, kOptimizerPhase),
        dp_phase(data_parallel_->group(), kOptimizerPhase);
    const auto optimizer_start = Clock::now();
    optimizer_->step(be_, model_->parameters(), r.lr, control_, data_parallel_->grad_shard());
    r.optimizer_seconds = seconds_since(optimizer_start);
  }
  data_parallel_->gather_parameters(be_);
  updating_ = false;
  // The step's collectives end (a device communicator's, waited for with its peers' errors
  // and a timeout, so that the read below never waits on a broken group), then the step's
  // one wait for the device: its loss and norm (a counting backend writes nothing: zeros).
  // Parameter gathers still running (parallel.overlap_param_gather) are the next forward's
  // to wait for: the scalars read below do not depend on them.
  complete_collectives({model_->tensor_parallel().comm, pp_,
                        data_parallel_->gathering() ? nullptr : dp, embedding_group_.get()});
  double host[kHostScalars] = {0.0, 0.0};
  be_.to_host(host, scalars_.view(0, {kHostScalars}));
  r.loss = host[kLoss];
  r.grad_norm = host[kNorm];
  loss_not_finite_ = !std::isfinite(r.loss);
  const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  if (!finite && config_.training.on_nonfinite == OnNonfinite::stop)
    fail(
        "step {}: the loss is {} (grad norm {}); stopping (set training.on_nonfinite = \"skip\" "
        "to skip such steps)",
        step + 1, message_number(r.loss), message_number(r.grad_norm));
  r.skipped = !finite;
  if (finite) {
    // What clip_and_check computed on the device, by the same formula.
    r.clip = clip_factor(r.grad_norm, max_norm);
    optimizer_->count_step();
  }
  r.seconds = seconds_since(t0);
  return r;
}

}  // namespace bottle
