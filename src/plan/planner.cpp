#include "plan/planner.h"

#include <algorithm>
#include <numeric>

#include "core/setting_error.h"
#include "model/llama.h"
#include "parallel/recompute.h"
#include "parallel/tp_layout.h"
#include "parallel/tp_layouts.h"
#include "pipeline/schedule_replay.h"
#include "plan/cost_model.h"
#include "plan/dry_run.h"
#include "plan/timeline_replay.h"
#include "train/memory_plan.h"

namespace bottle {
namespace {

// Seconds of a group's calls: the micro-batches' collectives (first pass and recomputation),
// their sends, and the step's once-per-step reductions (the gradient norm's, the loss's, DP's
// gradients, the tied embedding's), which belong to its tail.
struct CallSeconds {
  double first = 0, recompute = 0, sends = 0, tail = 0;
  double optimizer = 0;  // the optimizer's own (Muon's Gram all-reduces and gathers)
};

// Where a group of the dry run sits among the world's ranks: rank r of it is world rank
// base + r · stride.
struct GroupPlace {
  int64_t base = 0, stride = 1;
};

bool once_per_step(const CallShape& call) {
  return call.site.find("grad_norm") != std::string::npos || call.site.ends_with(".loss") ||
         call.site.starts_with("dp.") || call.site.find("tied") != std::string::npos;
}

// One call of a group placed at `place`.
double call_seconds(const ClusterSpec& c, const CallShape& call, GroupPlace place) {
  const int nodes = nodes_spanned(c, place.base + call.first * place.stride, call.ranks,
                                  call.stride * place.stride);
  return collective_seconds(c, call.kind, call.bytes(), call.ranks, nodes);
}

CallSeconds price_calls(const ClusterSpec& c, const std::map<CallShape, int64_t>& calls,
                        GroupPlace place, bool whole_group_is_tail) {
  CallSeconds s;
  for (const auto& [call, count] : calls) {
    const double t = double(count) * call_seconds(c, call, place);
    if (call.site.starts_with(kOptimizerPhase))
      s.optimizer += t;
    else if (call.kind == Collective::send || call.kind == Collective::recv)
      s.sends += t;
    else if (whole_group_is_tail || once_per_step(call))
      s.tail += t;
    else if (call.recompute)
      s.recompute += t;
    else
      s.first += t;
  }
  return s;
}

// The DP bucket calls of a stage at `site` (dp.grads.bucket, dp.params.all_gather): their
// priced seconds and count.
std::pair<double, int64_t> dp_buckets(const ClusterSpec& c,
                                      const std::map<CallShape, int64_t>& calls, GroupPlace place,
                                      std::string_view site) {
  double seconds = 0;
  int64_t count = 0;
  for (const auto& [call, n] : calls) {
    if (call.site != site) continue;
    const int nodes = nodes_spanned(c, place.base + call.first * place.stride, call.ranks,
                                    call.stride * place.stride);
    seconds += double(n) * collective_seconds(c, call.kind, call.bytes(), call.ranks, nodes);
    count += n;
  }
  return {seconds, count};
}

// What of b equal gradient buckets (G seconds serially) the caller still waits for when they
// start during the last micro-batch's backward (parallel.overlap_grad_reduce). The rule: the
// backward of W seconds finishes the buckets evenly, bucket i at W·i/b, and the link carries
// one at a time, so the last ends at max(W + G/b, W/b + G): exposed = max(G/b, G − W·(b−1)/b).
// The last bucket (the embedding's end) never hides.
double exposed_gradient_seconds(double G, int64_t b, double W) {
  if (b <= 0) return 0;
  return std::max(G / double(b), G - W * double(b - 1) / double(b));
}

// What the DP group's overlapped calls hide and what overlapping them costs, in seconds, from
// the stage's compute and TP collectives per step (`compute_and_tp`) and its recomputation.
struct DpOverlap {
  double hidden = 0, contention = 0;
};
DpOverlap dp_overlap_seconds(const ClusterSpec& cluster, const ParallelConfig& p, int m,
                             const std::map<CallShape, int64_t>& calls, GroupPlace place,
                             double compute_and_tp, double recompute) {
  DpOverlap r;
  // Overlapped DP: the buckets (all-reduced, or reduce-scattered under ZeRO) run under the
  // last micro-batch's backward, two thirds of its compute and TP collectives (backward is
  // twice forward's GEMMs), recomputation included; under ZeRO-2, which reduces every
  // micro-batch's, under every backward of the step.
  // Started on the communication thread, the buckets and gathers take 1 + c times their
  // blocking price (the cluster's overlap.call_slowdown); the extra is in dp_contention.
  // hidden(blocking, b, window, passes): of b calls priced `blocking` in all, issued in step
  // with a pass of `window` seconds, the part that runs under it, for each of `passes` such
  // passes.
  const double started = 1.0 + cluster.overlap_call_slowdown;
  double call_extra = 0;
  auto hidden = [&](double blocking, int64_t b, double window, int passes = 1) {
    call_extra += passes * blocking * (started - 1.0);
    const double priced = blocking * started;
    return passes * (priced - exposed_gradient_seconds(priced, b, window));
  };
  if (p.overlap_grad_reduce && p.dp > 1) {
    const auto [G, b] = dp_buckets(cluster, calls, place, "dp.grads.bucket");
    const double share = p.zero >= 2 ? 1.0 : 1.0 / m;
    r.hidden = hidden(G, b, ((2.0 / 3.0) * compute_and_tp + recompute) * share);
  }
  // ZeRO's parameter all-gathers under the next step's first forward (one third of a
  // micro-batch's compute and TP collectives), by the same rule read forwards: the forward
  // needs bucket i at W·i/b, and the first bucket never hides.
  // (ZeRO-3 gathers only a tied table's unit after the update, and waits for it there.)
  if (p.zero > 0 && p.zero < 3 && p.overlap_param_gather && p.dp > 1) {
    const auto [A, b] = dp_buckets(cluster, calls, place, "dp.params.all_gather");
    r.hidden += hidden(A, b, (1.0 / 3.0) * compute_and_tp / m);
  }
  // ZeRO-3's unit gathers, before every unit's forward and backward of every micro-batch:
  // each pass's run under that pass's compute by the same rule (unit i needed at W·i/b, the
  // first never hidden), a forward a third of a micro-batch's compute and TP collectives,
  // a backward two thirds and its recomputation; the 2·m passes taken as equal shares.
  if (p.zero >= 3 && p.overlap_param_gather && p.dp > 1) {
    const auto [A, b] = dp_buckets(cluster, calls, place, "dp.params.unit_gather");
    const double forward = (1.0 / 3.0) * compute_and_tp / m,
                 backward = ((2.0 / 3.0) * compute_and_tp + recompute) / m;
    for (const double window : {forward, backward})
      r.hidden += hidden(A / (2.0 * m), b / (2 * m), window, m);
  }
  // The kernels beside the hidden buckets and gathers run 1 + s times slower (the cluster's
  // overlap.compute_slowdown): of the H seconds they share with the transfers they do only
  // H / (1 + s) seconds of work, so the step grows by H · s / (1 + s).
  const double s_over = cluster.overlap_compute_slowdown;
  r.contention = r.hidden * s_over / (1.0 + s_over) + call_extra;
  return r;
}

// The TP collectives parallel.tp_overlap hides, and what the kernels beside them lose, in
// seconds: the stage's timeline priced event by event and replayed (plan/timeline_replay.h
// states the rule). `call_extra`: what the started calls take beyond their blocking price.
ReplayTimes tp_overlap_replay(const ClusterSpec& c, const std::vector<TpTimelineEvent>& timeline,
                              GroupPlace place, bool bf16, double& call_extra) {
  call_extra = 0;
  std::vector<TimedEvent> timed;  // [timeline.size()]
  timed.reserve(timeline.size());
  for (const TpTimelineEvent& e : timeline) {
    switch (e.kind) {
      case TpTimelineEvent::Kind::work:
        timed.push_back({TimedEvent::Kind::work, ops_seconds(c, e.work, false, bf16)});
        break;
      case TpTimelineEvent::Kind::issue: {
        // A started call runs on the communication thread, which polls it with pauses.
        const double blocking = call_seconds(c, e.call, place);
        const double extra = e.started ? blocking * c.overlap_call_slowdown : 0.0;
        call_extra += extra;
        timed.push_back({TimedEvent::Kind::issue, blocking + extra, e.id, e.started});
        break;
      }
      case TpTimelineEvent::Kind::wait:
        timed.push_back({TimedEvent::Kind::wait, 0.0, e.id});
        break;
    }
  }
  return replay_timeline(timed, 1.0 + c.overlap_compute_slowdown);
}

// What the TP group's started calls (TP overlap's halves, the async TP backward's input
// gradients) hide of their priced time, and what overlapping costs (the kernels' loss beside
// the calls, the started calls' own slowdown), in seconds per step: the stage's timeline
// replayed, scaled from the micro-batches it covers to the step's m. Zeros without a timeline.
struct TpHiding {
  double hidden = 0, contention = 0;
};
TpHiding started_tp_calls(const ClusterSpec& c, const StageCounts& counts, GroupPlace place,
                          bool bf16, int m) {
  if (counts.tp_timeline.empty()) return {};
  double call_extra = 0;
  const ReplayTimes replay = tp_overlap_replay(c, counts.tp_timeline, place, bf16, call_extra);
  const double scale = double(m) / double(counts.timeline_micro_batches);
  return {replay.hidden() * scale, (replay.stretch + call_extra) * scale};
}

// The seconds one message of a stage's sends at `site` (pp.activation, pp.gradient) takes on
// its link: their priced time over their count (0 when the stage sends none).
double message_seconds(const ClusterSpec& c, const std::map<CallShape, int64_t>& calls,
                       GroupPlace place, std::string_view site) {
  double seconds = 0;
  int64_t count = 0;
  for (const auto& [call, n] : calls) {
    if (call.kind != Collective::send || call.site.find(site) == std::string::npos) continue;
    seconds += double(n) * call_seconds(c, call, place);
    count += n;
  }
  return count ? seconds / double(count) : 0.0;
}

// One stage's passes for the pipeline replay, per micro-batch and chunk, from its seconds per
// micro-batch of first-pass compute and TP collectives (`first`) and of recomputation. The dry
// run counts a micro-batch's passes together, so they are split as the planner splits them
// elsewhere (dp_overlap_seconds): the backward's GEMMs are twice the forward's, F = ⅓ and
// BW = ⅔ of `first`, and recomputation runs in the backward. A schedule splitting the backward
// takes B and W as 1:1 of BW's GEMM FLOPs (dX and dW of each GEMM have the same FLOPs; the dry
// run has no split to read), recomputation with B, which needs it first.
// `weight`: the W passes' seconds where the dry run ran them apart (a schedule splitting the
// backward: its kernels under kWeightPassPhase), in place of the 1:1 split; negative: unknown.
PassCosts pipeline_pass_costs(double first, double recompute, int chunks, double weight = -1) {
  const double v = chunks;
  const double w = weight >= 0 ? std::min(weight, 2 * first / 3) : first / 3;
  return PassCosts{.forward = first / 3 / v,
                   .backward_input = (2 * first / 3 - w + recompute) / v,
                   .backward_weight = w / v,
                   .backward = (2 * first / 3 + recompute) / v};
}

// The blocks pipeline stage `stage` holds.
int64_t stage_blocks(const TrainConfig& config, int stage) {
  const PipelineStage s{config.parallel.pp, stage};
  const int layers = int(config.model.num_layers);
  return s.end_layer(layers) - s.first_layer(layers);
}

// The TP sites of the blocks' own collectives: the mode's prefix (as bench tp reads them).
CommCounter block_counter(const StageCounts& counts, const TrainConfig& config) {
  const std::string prefix = config.parallel.tp_mode->name();
  CommCounter sum;
  for (const char* pass : {".fwd.", ".bwd."}) {
    const CommCounter c = calls_with_prefix(counts.calls.at("tp"), prefix + pass);
    sum.calls += c.calls;
    sum.elements += c.elements;
    sum.bytes += c.bytes;
  }
  return sum;
}

std::string validation_error(const TrainConfig& config) {
  const ParallelConfig& p = config.parallel;
  try {
    validate_layout(*p.tp_mode, config.model.shape(), p.tp);
    validate_recompute(config.training.recompute, *p.tp_mode, config.model.shape());
    validate_pipeline_stages(p.pp, config.model.num_layers);
  } catch (const SettingError& e) {
    return describe_setting_error(e);
  }
  // What the configuration loader refuses under parallel.tp_overlap and of the pipeline
  // schedule, by the same rules.
  if (const std::string refused = tp_overlap_refusal(config); !refused.empty())
    return "parallel.tp_overlap " + refused;
  return schedule_refusal(config);
}

// The most blocks a model may have for bottle plan: each stage's dry run lays out and runs every
// block it holds, so time and memory grow with them (a billion took 6 GB and then ran out of
// memory). The deepest published transformers (DeepNet) have 1,000 blocks; LLMs about 120.
constexpr int64_t kMaxPlannedLayers = 1024;
// The most micro-batches per step: --global-batch's bound (every one may be a micro-batch).
constexpr int64_t kMaxPlannedMicroBatches = int64_t(1) << 24;
// Under parallel.tp_overlap the dry run records the timeline of every micro-batch, which the
// planner replays whole: at most this many block passes (micro-batches × a stage's blocks),
// 4,096 micro-batches of LLaMA-7B's 32 blocks.
constexpr int64_t kMaxTimelineBlockPasses = int64_t(4096) * 32;

// Why `config`'s step is too long to plan, or "".
std::string step_length_exclusion(const TrainConfig& config) {
  const int64_t m = config.training.grad_accum_steps;
  if (m > kMaxPlannedMicroBatches)
    return fmt::format("{} micro-batches per step: the planner plans at most {}", m,
                       kMaxPlannedMicroBatches);
  const ParallelConfig& p = config.parallel;
  const int64_t blocks = (config.model.num_layers + p.pp - 1) / p.pp;  // the largest stage's
  if (p.tp_overlap && p.tp > 1 && m * blocks > kMaxTimelineBlockPasses)
    return fmt::format(
        "{} micro-batches per step of {} blocks a stage: under parallel.tp_overlap the dry run "
        "runs every one, and plans at most {} block passes",
        m, blocks, kMaxTimelineBlockPasses);
  return {};
}

}  // namespace

void check_plannable(const ModelConfig& model) {
  BOTTLE_CHECK(model.num_layers <= kMaxPlannedLayers,
               "model.num_layers = {}: bottle plan plans at most {} blocks (its dry run lays out "
               "and runs every block of each pipeline stage)",
               model.num_layers, kMaxPlannedLayers);
}

nlohmann::ordered_json prediction_json(const Prediction& r) {
  const ParallelConfig& p = r.config.parallel;
  nlohmann::ordered_json j{{"layout", r.label()},
                           {"tp_mode", p.tp_mode->name()},
                           {"full_rank_baseline", r.full_rank_baseline},
                           {"tp", p.tp},
                           {"pp", p.pp},
                           {"dp", p.dp},
                           {"schedule", enum_name(p.schedule)},
                           {"recompute", recompute_name(r.config.training.recompute)},
                           {"micro_batch_size", r.config.training.micro_batch_size},
                           {"micro_batches", r.config.training.grad_accum_steps}};
  if (!r.excluded.empty()) {
    j["excluded"] = r.excluded;
    return j;
  }
  j["step_s"] = r.step;
  j["compute_s"] = r.compute;
  j["tp_comm_s"] = r.tp_comm;
  // Where TP calls are started (TP overlap, the async TP backward): what they hide and cost.
  if (p.tp_overlap || (p.tp > 1 && p.tp_backward == TpBackward::async)) {
    j["tp_hidden_s"] = r.tp_hidden;
    j["tp_contention_s"] = r.tp_contention;
  }
  j["bubble_s"] = r.bubble;
  j["p2p_s"] = r.p2p;
  j["dp_comm_s"] = r.dp_comm;
  j["dp_hidden_s"] = r.dp_hidden;
  if (r.dp_contention > 0) j["dp_contention_s"] = r.dp_contention;
  j["recompute_s"] = r.recompute;
  j["optimizer_s"] = r.optimizer;
  j["tokens_per_s"] = r.tokens_per_s;
  j["mfu"] = r.mfu;
  j["peak_bound_s"] = r.peak_bound;
  j["slowest_stage"] = r.slowest_stage;
  j["tp_elements_per_token_block"] = r.tp_elements_per_token_block;
  j["tp_calls_per_block"] = r.tp_calls_per_block;
  j["tp_seconds_per_block_pass"] = r.tp_seconds_per_block_pass;
  for (size_t tag = 0; tag < size_t(MemoryTag::count); ++tag)
    j[fmt::format("{}_bytes", memory_tag_name(MemoryTag(tag)))] = r.memory.bytes[tag];
  j["memory_bytes"] = r.memory.total();
  j["fits"] = r.fits;
  return j;
}

std::string nothing_fits(const std::vector<Prediction>& rows, const ClusterSpec& cluster,
                         const TrainConfig& config, int gpus) {
  const Prediction* smallest = nullptr;
  for (const Prediction& r : rows) {
    if (!r.excluded.empty()) continue;
    if (r.fits) return {};
    if (!smallest || r.memory.total() < smallest->memory.total()) smallest = &r;
  }
  if (!smallest)
    return fmt::format(
        "No layout of {} GPU(s) can be planned: every one is excluded, each with "
        "its reason below.",
        gpus);
  // What the search left as the configuration has it, and so what else would lower the plan.
  const std::string seq = fmt::format("a shorter training.seq_len ({})", config.training.seq_len);
  const std::string levers =
      config.parallel.zero < 3
          ? fmt::format("more GPUs (--gpus), {} or a higher parallel.zero ({}, where dp > 1)", seq,
                        config.parallel.zero)
          : fmt::format("more GPUs (--gpus) or {}", seq);
  return fmt::format(
      "No layout fits the {:g} GiB of a {}.\n  The smallest plan, {}, needs {} on its largest "
      "rank:\n  {};\n  {} would lower it.",
      cluster.memory_gib, cluster.gpu_name, smallest->label(),
      format_bytes(smallest->memory.total()), describe_memory(smallest->memory), levers);
}

ModelConfig full_rank_model(const ModelConfig& model) {
  ModelConfig m = model;
  m.bottleneck = BottleneckKind::none;
  m.rank = 0;
  m.ranks = {};
  m.mlp_gate_act.reset();
  return m;
}

std::string Prediction::label() const {
  const ParallelConfig& p = config.parallel;
  std::string l = fmt::format("{}{} tp{} pp{} dp{}", p.tp_mode->name(),
                              full_rank_baseline ? " (full-rank model)" : "", p.tp, p.pp, p.dp);
  if (whole_layout) return l;
  if (p.pp > 1) l += fmt::format(" {}", enum_name(p.schedule));
  l += fmt::format(" recompute={} mb{} x{}", recompute_name(config.training.recompute),
                   config.training.micro_batch_size, config.training.grad_accum_steps);
  return l;
}

Prediction predict(const TrainConfig& config, const ClusterSpec& cluster, bool full_rank_baseline) {
  Prediction r;
  r.config = config;
  r.full_rank_baseline = full_rank_baseline;
  check_plannable(config.model);
  r.excluded = validation_error(config);
  if (r.excluded.empty()) r.excluded = step_length_exclusion(config);
  if (!r.excluded.empty()) return r;
  const ParallelConfig& p = config.parallel;
  const int m = int(config.training.grad_accum_steps);
  const int dp_stride = p.tp, pp_stride = p.tp * p.dp;
  std::vector<double> per_micro_batch(size_t(p.pp));
  std::vector<PassCosts> pass_costs(size_t(p.pp)), peak_costs(size_t(p.pp));
  const bool bf16 = config.training.precision == Precision::bf16;
  const double peak = (bf16 ? cluster.bf16_tflops : cluster.fp32_tflops) * 1e12;
  struct StageTime {
    double compute, recompute, tp, p2p, tail_compute, tail_comm, dp_hidden, tp_hidden;
    double dp_contention, tp_contention;
    double weight;  // of compute, the W passes' (a split backward's; 0 otherwise)
  };
  std::vector<StageTime> stages;
  double model_flops = 0;
  for (int s = 0; s < p.pp; ++s) {
    const StageCounts counts = dry_run_stage(config, s);
    StageTime t{};
    for (const auto& [phase, ops] : counts.ops) {
      // The optimizer's work (Muon's GEMMs included) is all tail.
      const double body = ops_seconds(cluster, ops, false, bf16);
      if (phase == kOptimizerPhase)
        t.tail_compute += body;
      else if (phase == kWeightPassPhase)
        t.compute += body, t.weight += body;  // first-pass work, which W runs
      else
        (phase.empty() ? t.compute : t.recompute) += body;
      t.tail_compute += ops_seconds(cluster, ops, true, bf16);
    }
    // This stage's TP rank 0 of DP replica 0 is world rank s · tp · dp (process_groups.h).
    const int64_t stage_base = int64_t(s) * p.tp * p.dp;
    const CallSeconds tp = price_calls(cluster, counts.calls.at("tp"), {stage_base, 1}, false);
    const CallSeconds pp = price_calls(cluster, counts.calls.at("pp"), {0, pp_stride}, false);
    const CallSeconds dp =
        price_calls(cluster, counts.calls.at("dp"), {stage_base, dp_stride}, true);
    t.tp = tp.first;
    t.recompute += tp.recompute + pp.recompute;
    // What started TP calls hide comes off the first pass's TP collectives, then off
    // recomputation's (its collectives are in t.recompute); what overlapping costs is added to
    // the first pass's. (Only the blocks' passes start calls, so all of it comes off one of the
    // two; the cap keeps tp_hidden what was taken off.)
    const TpHiding hiding = started_tp_calls(cluster, counts, {stage_base, 1}, bf16, m);
    const double from_first = std::min(hiding.hidden, t.tp);
    const double from_recompute = std::min(hiding.hidden - from_first, tp.recompute);
    t.tp += hiding.contention - from_first;
    t.recompute -= from_recompute;
    t.tp_hidden = from_first + from_recompute;
    t.tp_contention = hiding.contention;
    t.p2p = pp.sends;
    t.tail_compute += tp.optimizer + dp.optimizer;
    t.tail_comm = tp.tail + pp.tail + pp.first + dp.tail;
    const DpOverlap dp_overlap =
        dp_overlap_seconds(cluster, p, m, counts.calls.at("dp"), {stage_base, dp_stride},
                           t.compute + t.tp, t.recompute);
    t.dp_hidden = dp_overlap.hidden;
    t.dp_contention = dp_overlap.contention;
    t.tail_comm += t.dp_contention - t.dp_hidden;
    stages.push_back(t);
    // The stage computes c_s per micro-batch; its transfers cross the link while it computes
    // (the executor sends without blocking and posts receives ahead), so each message is a
    // latency on its way, its send's priced seconds, and the replay puts it where it delays
    // the receiver.
    per_micro_batch[size_t(s)] = (t.compute + t.recompute + t.tp) / m;
    PassCosts& costs = pass_costs[size_t(s)];
    const bool split = schedule_info(p.schedule).splits_weight_pass;
    costs = pipeline_pass_costs((t.compute + t.tp) / m, t.recompute / m, p.virtual_stages,
                                split ? t.weight / m : -1);
    costs.activation_latency =
        message_seconds(cluster, counts.calls.at("pp"), {0, pp_stride}, "pp.activation");
    costs.gradient_latency =
        message_seconds(cluster, counts.calls.at("pp"), {0, pp_stride}, "pp.gradient");
    model_flops += counts.model_flops;
    double stage_flops = 0, recompute_flops = 0, weight_flops = 0;
    for (const auto& [phase, ops] : counts.ops) {
      stage_flops += ops.flops();
      if (phase == kWeightPassPhase)
        weight_flops += ops.flops();
      else if (!phase.empty() && phase != kOptimizerPhase)
        recompute_flops += ops.flops();
    }
    // The peak bound: the same pipeline at the dense peak with free communication.
    peak_costs[size_t(s)] =
        pipeline_pass_costs((stage_flops - recompute_flops) / peak / m, recompute_flops / peak / m,
                            p.virtual_stages, split ? weight_flops / peak / m : -1);
    if (counts.memory.total() > r.memory.total()) r.memory = counts.memory;
    if (s == 0) {
      const CommCounter block = block_counter(counts, config);
      const double blocks = double(stage_blocks(config, 0));
      const double tokens = double(config.training.micro_batch_size * config.training.seq_len * m);
      r.tp_elements_per_token_block = double(block.elements) / (blocks * tokens);
      r.tp_calls_per_block = double(block.calls) / (blocks * m);
      // The blocks' own first-pass collectives, priced alone: per block and pass.
      const std::string prefix = p.tp_mode->name();
      double block_seconds = 0;
      for (const auto& [call, count] : counts.calls.at("tp"))
        if (call.site.starts_with(prefix + ".fwd.") || call.site.starts_with(prefix + ".bwd."))
          block_seconds += double(count) *
                           collective_seconds(cluster, call.kind, call.bytes(), call.ranks,
                                              nodes_spanned(cluster, 0, call.ranks, call.stride));
      r.tp_seconds_per_block_pass = block_seconds / (blocks * 2 * m);
    }
  }
  const auto slowest = std::max_element(per_micro_batch.begin(), per_micro_batch.end());
  r.slowest_stage = int(slowest - per_micro_batch.begin());
  // The pipeline: the schedule's own action lists replayed with these costs (schedule_replay.h).
  // For 1F1B and GPipe with equal stages and no latency it is the closed form
  // (m + p − 1)·c_s of docs/design.md §8.
  const double pipe = pipeline_makespan(p.schedule, p.pp, m, p.virtual_stages, pass_costs);
  const StageTime& t = stages[size_t(r.slowest_stage)];
  // The step ends when the last stage to finish its tail does.
  const StageTime& tail =
      *std::max_element(stages.begin(), stages.end(), [](const StageTime& a, const StageTime& b) {
        return a.tail_compute + a.tail_comm < b.tail_compute + b.tail_comm;
      });
  r.compute = t.compute;
  r.recompute = t.recompute;
  r.tp_comm = t.tp;
  r.tp_hidden = t.tp_hidden;
  r.tp_contention = t.tp_contention;
  r.p2p = t.p2p;
  r.bubble = pipe - m * *slowest;
  r.optimizer = tail.tail_compute;
  r.dp_comm = tail.tail_comm;
  r.dp_hidden = tail.dp_hidden;
  r.dp_contention = tail.dp_contention;
  r.step = pipe + tail.tail_compute + tail.tail_comm;
  const double tokens =
      double(config.training.micro_batch_size * config.training.seq_len * m * p.dp);
  r.tokens_per_s = tokens / r.step;
  const double gpus = double(p.tp) * p.pp * p.dp;
  r.mfu = model_flops * p.tp * p.dp / (r.step * gpus * peak);
  r.peak_bound = pipeline_makespan(p.schedule, p.pp, m, p.virtual_stages, peak_costs);
  r.fits = double(r.memory.total()) <= cluster.memory_gib * double(1 << 30);
  return r;
}

std::vector<Prediction> plan_layouts(const TrainConfig& config, const ClusterSpec& cluster,
                                     const PlanRequest& request) {
  check_plannable(config.model);
  int64_t global_batch = request.global_batch;
  if (global_batch <= 0) {
    // The configuration's, bounded as --global-batch is.
    const TrainingConfig& t = config.training;
    const bool overflow =
        __builtin_mul_overflow(t.micro_batch_size, t.grad_accum_steps, &global_batch) ||
        __builtin_mul_overflow(global_batch, int64_t(config.parallel.dp), &global_batch);
    BOTTLE_CHECK(!overflow && global_batch <= kMaxPlannedMicroBatches,
                 "training.micro_batch_size {} x training.grad_accum_steps {} x parallel.dp {}: "
                 "more sequences per step than the planner plans (at most {}, as "
                 "--global-batch)",
                 t.micro_batch_size, t.grad_accum_steps, config.parallel.dp,
                 kMaxPlannedMicroBatches);
  }
  std::vector<std::pair<ModelConfig, bool>> models{{config.model, false}};
  if (request.full_rank_baseline && config.model.bottleneck != BottleneckKind::none)
    models.emplace_back(full_rank_model(config.model), true);
  std::vector<Prediction> out;
  for (const auto& [model, baseline] : models)
    for (const TpLayout* mode : tp_layouts()) {
      if (!mode->fits(model.bottleneck)) continue;
      for (int tp = 1; tp <= request.gpus; ++tp) {
        if (request.gpus % tp || (request.tp && tp != request.tp)) continue;
        for (int pp = 1; pp <= request.gpus / tp; ++pp) {
          if ((request.gpus / tp) % pp || (request.pp && pp != request.pp)) continue;
          const int dp = request.gpus / tp / pp;
          TrainConfig layout = config;
          layout.model = model;
          layout.parallel.tp = tp;
          layout.parallel.pp = pp;
          layout.parallel.dp = dp;
          layout.parallel.tp_mode = mode;
          layout.training.recompute = Recompute::none;
          // The schedule is the candidates' below; the layout's own checks use the default.
          layout.parallel.schedule = PipelineSchedule::one_f_one_b;
          layout.parallel.virtual_stages = 1;
          // A layout the model cannot take is one exclusion, whatever its policy and batch.
          {
            const TrainConfig& c = layout;
            Prediction r;
            r.excluded = validation_error(c);
            if (r.excluded.empty() && global_batch % dp != 0)
              r.excluded =
                  fmt::format("the global batch of {} sequences does not split over {} replicas",
                              global_batch, dp);
            if (!r.excluded.empty()) {
              r.config = c;
              r.full_rank_baseline = baseline;
              r.whole_layout = true;
              out.push_back(r);
              continue;
            }
          }
          for (Recompute policy : {Recompute::none, Recompute::block, Recompute::lowrank}) {
            if (!mode->supports(policy, model.shape())) continue;
            // The registry's schedules that the model runs (schedule_runnable), so that every
            // plan can be trained; one stage has no pipeline, and is planned once, as 1f1b.
            for (const ScheduleInfo& info : schedules()) {
              const PipelineSchedule schedule = info.id;
              if (pp == 1 && schedule != PipelineSchedule::one_f_one_b) continue;
              if (!schedule_runnable(schedule)) continue;
              // An interleaving schedule is planned with two chunks per stage, the fewest it
              // takes.
              const int virtual_stages = info.needs_virtual_stages ? 2 : 1;
              // Every micro-batch size that divides a replica's share, up to 64 sequences.
              for (int64_t mb = 1; mb <= global_batch / dp && mb <= 64; ++mb) {
                if ((global_batch / dp) % mb) continue;
                // TP overlap splits a micro-batch into two halves of its sequences.
                if (config.parallel.tp_overlap && mb % 2) continue;
                TrainConfig c = layout;
                c.parallel.schedule = schedule;
                c.parallel.virtual_stages = virtual_stages;
                c.training.recompute = policy;
                c.training.micro_batch_size = mb;
                c.training.grad_accum_steps = global_batch / (int64_t(dp) * mb);
                // A micro-batch count the schedule does not take is no candidate of it, nor is a
                // split backward beside what it does not run with (recomputation, ZeRO-2/3).
                if (!schedule_shape_error(schedule, pp, c.training.grad_accum_steps, virtual_stages)
                         .empty() ||
                    !split_backward_refusal(c).empty())
                  continue;
                Prediction r;
                r.config = c;
                r.full_rank_baseline = baseline;
                try {
                  r = predict(c, cluster, baseline);
                } catch (const Error& e) {
                  r.excluded = e.what();  // such as the address space a plan needs
                }
                out.push_back(r);
              }
            }
          }
        }
      }
    }
  auto rank = [](const Prediction& r) { return r.excluded.empty() ? (r.fits ? 0 : 1) : 2; };
  std::stable_sort(out.begin(), out.end(), [&](const Prediction& a, const Prediction& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    return rank(a) < 2 && a.step < b.step;
  });
  return out;
}

}  // namespace bottle
