// `bottle bench pipeline` (bench/pipeline_bench.h): every pipeline schedule the model runs timed
// for the full-rank and the bottleneck model.
#include "bench/pipeline_bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "comm/process_groups.h"
#include "core/statistics.h"
#include "model/llama.h"
#include "pipeline/schedule_replay.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

struct PipelineResult {
  double step_ms = 0, bubble = 0;  // bubble: mean over stages, of the schedule's time
  int64_t dp_grad_elements = 0;    // per DP rank and step, the whole model (all stages)
  // The activation buffers of the stage holding the most, and the micro-batches it keeps in
  // flight (the schedule's slots: pipeline/schedule.h's peak_in_flight).
  double activation_bytes = 0, slots = 0;
  // The schedule's bubble replayed (pipeline/schedule_replay.h) with each stage's passes at
  // what they took in this run (their medians per micro-batch), and those costs of stage 0, in
  // seconds: theory at this machine's F, B and W instead of F = B = W.
  double measured_cost_bubble = 0;
  PassCosts stage0;
};

PipelineResult measure(const TrainConfig& config, const ModelConfig& model_config,
                       PipelineSchedule schedule, ProcessGroups& groups, int steps, int warmup) {
  // The step of `bottle train` at the constant rate optimizer.lr, with this model (full TP
  // for the full-rank one) and schedule.
  TrainConfig c = bench_step_config(config);
  c.model = model_config;
  if (model_config.bottleneck == BottleneckKind::none)
    c.parallel.tp_mode = &default_tp_layout(model_config.shape());
  c.parallel.schedule = schedule;
  c.parallel.virtual_stages = schedule_info(schedule).needs_virtual_stages ? 2 : 1;
  auto be = make_backend("cpu");
  TrainStep train_step(c, *be, tensor_parallel_of(c, groups.tp.get()), groups.pp.get(),
                       groups.dp.get());
  train_step.model().init_weights(uint64_t(config.training.seed));
  train_step.allocate_activations();
  const double activation_bytes = reduce_scalar(
      groups.world, double(train_step.model().activation_bytes()), ReduceOp::max, "bench.max");
  const double slots =
      reduce_scalar(groups.world, double(train_step.model().slots()), ReduceOp::max, "bench.max");
  // Random tokens, the same on every rank: per micro-batch its inputs, then its targets.
  std::mt19937 rng(uint32_t(config.training.seed));
  for (int m = 0; m < train_step.micro_batches(); ++m)
    for (const Tensor& t : {train_step.inputs()[size_t(m)], train_step.targets()[size_t(m)]}) {
      std::vector<int32_t> tokens(size_t(t.numel()));
      for (int32_t& id : tokens) id = int32_t(rng() % uint32_t(model_config.vocab_size));
      be->from_host(t, tokens.data());
    }
  const int stages = int(c.parallel.pp);
  const int m = train_step.micro_batches();
  std::vector<double> step_ms, bubble;
  std::array<std::vector<double>, 4> pass;  // per pass, this stage's seconds per micro-batch
  int64_t dp_elements = 0;
  for (int step = 0; step < warmup + steps; ++step) {
    groups.world->barrier();
    if (groups.dp) groups.dp->stats().reset();
    const StepResult r = train_step.step(step);
    // The slowest stage sets the pipeline's time; each stage's bubble is its idle share.
    const double pipeline_wall =
        reduce_scalar(groups.world, r.pipeline_seconds, ReduceOp::max, "bench.max");
    const double idle = 1.0 - r.compute_seconds / pipeline_wall;
    const double mean_idle =
        reduce_scalar(groups.pp.get(), idle, ReduceOp::sum, "bench.sum") / double(stages);
    const double wall = reduce_scalar(groups.world, r.seconds, ReduceOp::max, "bench.max");
    if (step < warmup) continue;
    step_ms.push_back(wall * 1e3);
    bubble.push_back(mean_idle);
    for (size_t k = 0; k < pass.size(); ++k) pass[k].push_back(r.pass_seconds[k] / m);
    dp_elements = groups.dp ? groups.dp->stats().with_prefix("dp.grads").elements : 0;
  }
  // Every stage's pass costs on every rank (each stage adds its own into its place).
  const int stage = groups.pp ? groups.pp->rank() : 0;
  std::vector<PassCosts> costs(static_cast<size_t>(stages));  // [stages]
  for (int s = 0; s < stages; ++s) {
    auto cost = [&](Pass p) {
      const double mine = s == stage ? median(pass[size_t(p)]) : 0.0;
      return groups.pp ? reduce_scalar(groups.pp.get(), mine, ReduceOp::sum, "bench.sum") : mine;
    };
    costs[size_t(s)] = PassCosts{.forward = cost(Pass::F),
                                 .backward_input = cost(Pass::B),
                                 .backward_weight = cost(Pass::W),
                                 .backward = cost(Pass::BW)};
  }
  std::vector<std::vector<Action>> lists;
  for (int s = 0; s < stages; ++s)
    lists.push_back(pipeline_schedule(schedule, stages, s, m, c.parallel.virtual_stages));
  const double replayed = replay_schedule(lists, costs).bubble_fraction();
  return {median(step_ms),
          median(bubble),
          int64_t(reduce_scalar(groups.pp.get(), double(dp_elements), ReduceOp::sum, "bench.sum")),
          activation_bytes,
          slots,
          replayed,
          costs[0]};
}

}  // namespace

void run_bench_pipeline(const TrainConfig& config, const BenchPipelineOptions& o) {
  Communicator& world = world_communicator();
  const auto& p = config.parallel;
  ProcessGroups groups = ProcessGroups::create(world, {int(p.tp), int(p.pp), int(p.dp)});
  omp_set_num_threads(std::max(1, omp_get_num_procs() / world.size()));
  ModelConfig full_rank = config.model;
  full_rank.bottleneck = BottleneckKind::none;
  full_rank.rank = 0;
  full_rank.ranks = {};
  full_rank.mlp_gate_act.reset();
  std::vector<ModelConfig> models{full_rank};
  if (config.model.bottleneck != BottleneckKind::none) models.push_back(config.model);
  const int m = int(config.training.grad_accum_steps);
  if (world.rank() == 0)
    fmt::print(
        "bench pipeline: {}, tp {} x pp {} x dp {} (zero {}), {} micro-batches "
        "of {} x {} per step\n",
        o.config_path, p.tp, p.pp, p.dp, p.zero, m, config.training.micro_batch_size,
        config.training.seq_len);
  std::vector<int64_t> traffic;
  for (const ModelConfig& model : models) {
    // The registry's schedules that the model runs, each against its theory: the replay of its
    // action lists with unit costs (bubble_fraction), (p − 1)/(m + p − 1) for 1f1b and gpipe.
    for (const ScheduleInfo& info : schedules()) {
      if (!schedule_runnable(info.id)) continue;
      TrainConfig c = config;
      c.parallel.schedule = info.id;
      c.parallel.virtual_stages = info.needs_virtual_stages ? 2 : 1;
      if (const std::string refused = schedule_refusal(c); !refused.empty()) {
        if (world.rank() == 0)
          fmt::print("  {:<5} {:<16} not timed: {}\n", bottleneck_kind_name(model.bottleneck),
                     info.name, refused);
        continue;
      }
      const PipelineResult r = measure(config, model, info.id, groups, o.steps, o.warmup);
      if (info.id == PipelineSchedule::one_f_one_b) traffic.push_back(r.dp_grad_elements);
      if (world.rank() != 0) continue;
      const PassCosts& f = r.stage0;
      const std::string passes =
          schedule_info(info.id).splits_weight_pass
              ? fmt::format("F {:.1f} B {:.1f} W {:.1f}", f.forward * 1e3, f.backward_input * 1e3,
                            f.backward_weight * 1e3)
              : fmt::format("F {:.1f} BW {:.1f}", f.forward * 1e3, f.backward * 1e3);
      fmt::print(
          "  {:<5} {:<5} step {:>8.1f} ms | bubble {:>5.1f}% (ideal {:>5.1f}%; {:>5.1f}% at the "
          "passes' measured ms per micro-batch, stage 0: {}) | activations {:.1f} MiB, {:.0f} "
          "micro-batches in flight (largest stage) | DP gradient traffic {} elements ({:.1f} MB) "
          "per DP rank and step\n",
          bottleneck_kind_name(model.bottleneck), info.name, r.step_ms, 100.0 * r.bubble,
          100.0 * bubble_fraction(info.id, int(p.pp), m, c.parallel.virtual_stages),
          100.0 * r.measured_cost_bubble, passes, r.activation_bytes / double(1 << 20), r.slots,
          r.dp_grad_elements, double(r.dp_grad_elements) * 4 / 1e6);
      std::fflush(stdout);
    }
  }
  if (world.rank() == 0 && traffic.size() == 2 && traffic[1] > 0)
    fmt::print("  DP gradient traffic, full-rank / {}: {:.2f}x\n",
               bottleneck_kind_name(config.model.bottleneck),
               double(traffic[0]) / double(traffic[1]));
}

}  // namespace bottle
