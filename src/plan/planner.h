#pragma once
// `bottle plan`'s predictions (docs/design.md §22): a configuration's step on a cluster, for one
// layout or for every layout of a number of GPUs, from the dry run's counts priced by the cost
// model. The pipeline is the schedule's own action lists replayed (pipeline/schedule_replay.h):
//   c_s   = (compute + recompute + TP collectives of stage s) / m   per micro-batch, split in
//           F = ⅓ and BW = ⅔ of its compute and TP collectives plus its recomputation
//   a message between stages: a latency of its send's priced seconds (sends do not block)
//   pipe  = the replay's makespan     (= (m + p − 1) · c for 1F1B and GPipe on equal stages
//                                      without latency, the closed form this replaced)
//   step  = pipe + the slowest stage's tail (DP gradient reduction, the norm, AdamW)
// The overlaps modelled are the DP gradient buckets' under the last micro-batch's backward
// (parallel.overlap_grad_reduce) and ZeRO's parameter all-gathers under the next step's first
// forward (parallel.overlap_param_gather): the tail keeps only what they cannot hide
// (exposed_gradient_seconds in planner.cpp states the rule). Under parallel.tp_overlap the TP
// collectives of one half hide under the other half's kernels: the stage's timeline replayed
// with the kernels in order and one call at a time on the link (tp_overlap_replay states it).
// Kernels beside a hidden transfer run slower by the cluster's overlap.compute_slowdown. The
// breakdown is the slowest stage's, with bubble = pipe − m · max_s c_s: the waits, and what
// the messages' latencies add to them; p2p is the slowest stage's transfers' priced seconds,
// which overlap its compute and so are not a part of the sum.
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/arena.h"
#include "plan/cluster.h"
#include "train/train_config.h"

namespace bottle {

struct Prediction {
  TrainConfig config;  // the layout: parallel.*, training.micro_batch_size, .grad_accum_steps
  bool full_rank_baseline = false;  // the full-rank model of the same widths (tp_mode full)
  std::string excluded;       // non-empty: why this layout is not planned (nothing below is set)
  bool whole_layout = false;  // excluded whatever its schedule, policy and micro-batch
  // Seconds per optimizer step, and its parts: compute, TP collectives and recomputation (its
  // kernels and collectives) of the slowest stage's micro-batches; the pipeline bubble (the
  // sends' delays included); optimizer (its kernels and collectives, Muon's Gram all-reduces
  // included, and the norm) and dp_comm (the DP gradient reduction, the pipeline's scalar
  // reductions and the tied embedding's) of the stage whose tail ends last. p2p: the slowest
  // stage's sends and receives priced on their link, beside the parts (they overlap its compute;
  // what they delay is in the bubble).
  double step = 0, compute = 0, tp_comm = 0, bubble = 0, p2p = 0, dp_comm = 0, recompute = 0,
         optimizer = 0;
  double dp_hidden = 0;  // DP gradient reduction hidden under backward (not in dp_comm)
  double tp_hidden = 0;  // TP collectives hidden by parallel.tp_overlap (not in tp_comm)
  // What overlapping costs: the kernels' loss beside the hidden calls (the cluster's
  // overlap.compute_slowdown) and the started calls' own slowdown (overlap.call_slowdown).
  // Part of dp_comm and tp_comm.
  double dp_contention = 0, tp_contention = 0;
  double tokens_per_s = 0, mfu = 0;
  // The same pipeline at 100 % of the dense peak with free memory traffic and communication:
  // a lower bound no efficiency constant can beat.
  double peak_bound = 0;
  int slowest_stage = 0;
  MemoryBreakdown memory;  // the stage with the largest plan
  bool fits = false;
  // The blocks' own TP collectives outside recomputation (bench tp's counters): elements per
  // token and block, forward and backward together; calls per block; seconds per block and
  // pass.
  double tp_elements_per_token_block = 0, tp_calls_per_block = 0, tp_seconds_per_block_pass = 0;
  std::string label() const;  // "btp tp4 pp2 dp1 1f1b recompute=none mb4 x8"
};

// Fails, naming model.num_layers and the bound, for a model of more blocks than the planner
// plans: its dry runs lay out and run every block (predict and plan_layouts call it first).
void check_plannable(const ModelConfig& model);

// One layout as `config` sets it.
Prediction predict(const TrainConfig& config, const ClusterSpec& cluster,
                   bool full_rank_baseline = false);

struct PlanRequest {
  int gpus = 1;
  // Sequences per optimizer step over all replicas; 0: the configuration's (micro-batch ×
  // grad_accum_steps × dp).
  int64_t global_batch = 0;
  // Also the full-rank model of the same widths under Megatron TP, as the baseline the paper
  // compares against (a bottleneck configuration only).
  bool full_rank_baseline = true;
  // Only these TP and PP degrees (0: every divisor of gpus).
  int tp = 0, pp = 0;
};

// Every layout of request.gpus GPUs: TP mode, tp × pp × dp, schedule, recompute policy and
// micro-batch; the planned ones that fit first (fastest first), then those that do not fit,
// then the excluded ones with their reason.
std::vector<Prediction> plan_layouts(const TrainConfig& config, const ClusterSpec& cluster,
                                     const PlanRequest& request);

// Where no layout of plan_layouts' `rows` fits the cluster's GPU memory, a sentence that says so
// and why (the smallest plan against the GPU's memory, by tag, and what would lower it); where
// every layout is excluded, one that says that. "" where a layout fits.
std::string nothing_fits(const std::vector<Prediction>& rows, const ClusterSpec& cluster,
                         const TrainConfig& config, int gpus);

// A prediction as `plan --json` prints it.
nlohmann::ordered_json prediction_json(const Prediction& p);

// The full-rank model of `model`'s widths (Megatron TP's baseline).
ModelConfig full_rank_model(const ModelConfig& model);

}  // namespace bottle
