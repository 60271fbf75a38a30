// `bottle plan CONFIG --cluster PRESET|FILE [--gpus N] [--global-batch B]`: every layout of a
// configuration's model on N GPUs of a cluster, predicted from the dry run of bottle's own
// step (plan/planner.h) and ranked, best first. `bottle plan --calibrate FILE` measures this
// machine (GEMMs, memory bandwidth, attention, the collectives of the ranks it runs on) and
// writes it as a cluster file, so that the same model predicts the benches here.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "bench/calibrate.h"
#include "bench/paper_prediction.h"
#include "comm/communicator.h"
#include "parallel/recompute.h"
#include "plan/planner.h"
#include "train/memory_plan.h"

namespace bottle {
namespace {

const CommandKeys kPlanKeys{
    "plan",
    {"model.", "training.micro_batch_size", "training.seq_len", "training.grad_accum_steps",
     "training.recompute", "training.precision", "training.max_norm", "training.on_nonfinite",
     "optimizer.", "parallel."},
    {"training.steps", "training.eval_interval", "training.eval_batches", "training.seed",
     "training.backend", "training.threads", "training.memory_limit", "lr_scheduler.", "data.",
     "checkpoint.", "metrics."},
    "it predicts one training step per layout of the configuration's model"};

// The columns of one planned layout (memory as its total; --json has the breakdown).
void print_row(const std::string& rank, const Prediction& r, int width) {
  fmt::print(
      "  {:<4} {:<{}} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} {:>7.3f} "
      "{:>10.0f} {:>4.0f}% {:>10} {}\n",
      rank, r.label(), width, r.step, r.compute, r.tp_comm, r.bubble, r.p2p, r.dp_comm, r.recompute,
      r.optimizer, r.tokens_per_s, 100 * r.mfu, format_bytes(r.memory.total()),
      r.fits ? "yes" : "no");
}

void print_header(int width) {
  fmt::print(
      "  {:<4} {:<{}} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>7} {:>10} {:>5} {:>10} {}\n",
      "#", "layout", width, "step s", "compute", "tp comm", "bubble", "p2p", "dp+pp", "recomp",
      "optim", "tokens/s", "MFU", "memory", "fits");
}

// The fastest fitting layout of each TP mode (the full-rank baseline apart), in the order of
// the table, numbered as there: what a comparison of the modes reads first.
void print_best_per_mode(const std::vector<Prediction>& rows, int width) {
  std::vector<std::string> seen;
  std::vector<std::pair<size_t, const Prediction*>> best;
  size_t planned = 0;
  for (const Prediction& r : rows) {
    if (!r.excluded.empty()) continue;
    ++planned;
    if (!r.fits) continue;
    const std::string mode = std::string(r.config.parallel.tp_mode->name()) +
                             (r.full_rank_baseline ? " (full-rank model)" : "");
    if (std::find(seen.begin(), seen.end(), mode) != seen.end()) continue;
    seen.push_back(mode);
    best.emplace_back(planned, &r);
  }
  if (best.empty()) return;
  fmt::print("best per TP mode:\n");
  print_header(width);
  for (const auto& [rank, r] : best) print_row(std::to_string(rank), *r, width);
  fmt::print("every layout, fastest first:\n");
}

void print_table(const std::vector<Prediction>& rows, size_t top, bool all) {
  // The layout column as wide as its longest label.
  int width = 6;
  for (const Prediction& r : rows) width = std::max(width, int(r.label().size()));
  print_best_per_mode(rows, width);
  print_header(width);
  size_t shown = 0, planned = 0, excluded = 0;
  for (const Prediction& r : rows) {
    if (!r.excluded.empty()) {
      ++excluded;
      continue;
    }
    ++planned;
    if (!all && shown >= top) continue;
    ++shown;
    print_row(std::to_string(planned), r, width);
  }
  if (planned > shown)
    fmt::print("  … {} more planned layouts (--all shows them)\n", planned - shown);
  if (excluded == 0) return;
  fmt::print("excluded ({}):\n", excluded);
  size_t listed = 0;
  for (const Prediction& r : rows) {
    if (r.excluded.empty()) continue;
    if (!all && listed++ >= top) {
      fmt::print("  … {} more (--all lists them)\n", excluded - top);
      break;
    }
    fmt::print("  {:<{}} {}\n", r.label(), width, r.excluded);
  }
}

}  // namespace

Command add_plan_command(CLI::App& app) {
  struct Options {
    std::string config, cluster, calibrate;
    std::vector<std::string> overrides;
    int gpus = 0, tp = 0, pp = 0;
    int64_t global_batch = 0;
    size_t top = 20;
    bool json = false, all = false, no_baseline = false, paper = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("config", o->config, "training configuration (TOML)");
  app.add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  app.add_option(
      "--cluster", o->cluster,
      "a preset (" + fmt::format("{}", fmt::join(cluster_presets(), ", ")) + ") or a cluster file");
  app.add_option("--gpus", o->gpus, "GPUs to plan for (default: parallel.tp × pp × dp)")
      ->check(integer_in(1, 1 << 16));
  app.add_option("--global-batch", o->global_batch,
                 "sequences per optimizer step over all replicas (default: the configuration's "
                 "micro_batch_size × grad_accum_steps × dp)")
      ->check(integer_in(1, 1 << 24));
  app.add_option("--tp", o->tp, "plan only this TP degree")->check(integer_in(1, 1 << 16));
  app.add_option("--pp", o->pp, "plan only this number of pipeline stages")
      ->check(integer_in(1, 1 << 16));
  app.add_option("--top", o->top, "planned layouts listed (default 20)")->check(integer_in(1));
  app.add_flag("--all", o->all, "list every planned and excluded layout");
  app.add_flag("--no-baseline", o->no_baseline,
               "leave out the full-rank model of the same widths (Megatron TP) that a "
               "bottleneck configuration is compared with");
  app.add_flag("--json", o->json, "one JSON object per layout and line");
  app.add_flag("--paper", o->paper,
               "the BOOST paper's runs predicted on --cluster (default a100-perlmutter, the "
               "paper's machine) beside the paper's figures, as Markdown (--json: the rows)");
  app.add_option("--calibrate", o->calibrate,
                 "measure this machine (GEMMs, memory, attention, the collectives of the ranks "
                 "it runs on) and write it as a cluster file")
      ->check(output_file());
  return [o] {
    Communicator& world = world_communicator();
    if (!o->calibrate.empty()) {
      BOTTLE_CHECK(o->config.empty() && o->cluster.empty(),
                   "plan --calibrate FILE measures this machine: give it no configuration and "
                   "no --cluster");
      calibrate_cluster(world, o->calibrate);
      return 0;
    }
    if (o->paper) {
      BOTTLE_CHECK(o->config.empty(),
                   "plan --paper predicts the paper's own runs: give it no "
                   "configuration");
      const nlohmann::json rows =
          predict_paper_runs(load_cluster(o->cluster.empty() ? "a100-perlmutter" : o->cluster));
      if (world.rank() == 0)
        fmt::print("{}\n", o->json ? rows.dump()
                                   : paper_prediction_markdown(rows, PaperFigures::built_in()));
      return 0;
    }
    BOTTLE_CHECK(!o->config.empty(),
                 "plan: a training configuration is required (plan CONFIG "
                 "--cluster PRESET|FILE)");
    BOTTLE_CHECK(!o->cluster.empty(),
                 "plan: --cluster is required: a preset ({}) or a cluster "
                 "file (plan --calibrate FILE writes one for this machine)",
                 fmt::join(cluster_presets(), ", "));
    ConfigKeysGiven given;
    TrainConfig config = load_train_config(o->config, o->overrides, &given);
    check_honoured_keys(config, given, o->config, kPlanKeys);
    const ClusterSpec cluster = load_cluster(o->cluster);
    // Unless told, a cluster is planned in its native precision: the faster of its bf16 and
    // fp32 rates (bf16 on every GPU), not the configuration's default fp32.
    const bool precision_given =
        given.file.count("training.precision") || given.set.count("training.precision");
    if (!precision_given)
      config.training.precision =
          cluster.bf16_tflops > cluster.fp32_tflops ? Precision::bf16 : Precision::fp32;
    PlanRequest request;
    request.gpus =
        o->gpus ? o->gpus : int(config.parallel.tp * config.parallel.pp * config.parallel.dp);
    request.global_batch = o->global_batch;
    request.full_rank_baseline = !o->no_baseline;
    request.tp = o->tp;
    request.pp = o->pp;
    const int pinned = std::max(o->tp, 1) * std::max(o->pp, 1);
    BOTTLE_CHECK(request.gpus % pinned == 0,
                 "plan: {} does not divide the {} GPUs: the layout must use them all (tp × pp × "
                 "dp = GPUs)",
                 o->tp && o->pp ? fmt::format("--tp {} × --pp {} = {}", o->tp, o->pp, pinned)
                 : o->tp        ? fmt::format("--tp {}", o->tp)
                                : fmt::format("--pp {}", o->pp),
                 request.gpus);
    if (o->global_batch == 0)
      BOTTLE_CHECK(config.parallel.dp == 1 || o->gpus == 0,
                   "plan: --gpus {} with parallel.dp = {}: give --global-batch, the sequences per "
                   "step, which the configuration's dp would otherwise set",
                   o->gpus, config.parallel.dp);
    const std::vector<Prediction> rows = plan_layouts(config, cluster, request);
    if (world.rank() != 0) return 0;
    if (o->json) {
      // Where nothing fits, the sentence that says why comes first, as an object of its own.
      const std::string none = nothing_fits(rows, cluster, config, request.gpus);
      if (!none.empty()) fmt::print("{}\n", nlohmann::json{{"nothing_fits", none}}.dump());
      for (const Prediction& r : rows) fmt::print("{}\n", prediction_json(r).dump());
      return 0;
    }
    const ModelConfig& m = config.model;
    fmt::print(
        "bottle plan: {}, {} model d={} d_ff={} r={} L={} H={} V={}, sequence "
        "{}\n",
        o->config, bottleneck_kind_name(m.bottleneck), m.hidden_size, m.intermediate_size, m.rank,
        m.num_layers, m.num_heads, m.vocab_size, config.training.seq_len);
    fmt::print(
        "precision: {}{}\n", enum_name(config.training.precision),
        precision_given ? "" : " (the cluster's native one; training.precision sets another)");
    fmt::print(
        "cluster: {} GPU(s) of {} ({}): {} per node, {}, {:g} TFLOP/s bf16, {:g} GiB at {:g} "
        "GB/s\n",
        request.gpus, cluster.name, cluster.source, cluster.gpus_per_node, cluster.gpu_name,
        cluster.bf16_tflops, cluster.memory_gib, cluster.memory_bandwidth_gbs);
    fmt::print(
        "model: efficiencies GEMM {:g}, bandwidth {:g}; a layout fits when its largest rank's "
        "memory plan does\n",
        cluster.gemm_efficiency, cluster.bandwidth_efficiency);
    fmt::print(
        "step (seconds) = compute + TP collectives + pipeline bubble + sends + DP/PP "
        "reductions + recomputation + optimizer\n"
        "overlap: the DP gradient buckets hide under the last backward "
        "(parallel.overlap_grad_reduce),\n"
        "         ZeRO's parameter gathers under the next forward, ZeRO-3's each under "
        "the unit before it (parallel.overlap_param_gather);\n"
        "         and under parallel.tp_overlap one half's TP collectives under the other half's "
        "kernels (the step replayed in issue order, one call at a time on the link);\n"
        "         nothing else is overlapped\n");
    // Where nothing fits, why, before the rows that each say "no".
    const std::string none = nothing_fits(rows, cluster, config, request.gpus);
    if (!none.empty()) fmt::print("{}\n", none);
    print_table(rows, o->top, o->all);
    return 0;
  };
}

}  // namespace bottle
