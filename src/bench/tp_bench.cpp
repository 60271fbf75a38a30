// `bottle bench tp` (bench/tp_bench.h). Every mode runs under the configuration's
// training.recompute; --recompute adds each mode under the other policies (MB saved per ms of
// recomputation, against no recomputation); --fit LIMIT plans, without allocating, the largest
// micro-batch each mode and policy fits per rank. --components splits the time of the q/k/v
// and gate/up groups into compute and all-reduce (the grouping ablation of BOOST §4.3). Times
// are medians over the recorded steps, reported with their min and max.
#include "bench/tp_bench.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "backend/profiling_backend.h"
#include "bench/paper_figures.h"
#include "bench/results.h"
#include "comm/process_groups.h"
#include "core/statistics.h"
#include "model/llama.h"
#include "plan/planner.h"
#include "train/memory_plan.h"
#include "train/train_step.h"

namespace bottle {
namespace {

// The modes bench tp compares side by side, as the paper does: Megatron TP on the full-rank
// model, vanilla and bottleneck-aware TP on the configuration's bottleneck model.
const TpLayout* full_mode() { return &tp_layout("full"); }
const TpLayout* vanilla_mode() { return &tp_layout("vanilla"); }
const TpLayout* btp_mode() { return &tp_layout("btp"); }

struct Variant {
  const TpLayout* mode;
  bool grouping;
  NormStatistic statistic = NormStatistic::from_latent;
  Recompute recompute = Recompute::none;
  bool overlap = false;                     // parallel.tp_overlap
  TpBackward backward = TpBackward::async;  // parallel.tp_backward
  std::string label() const {
    std::string l = mode->name();
    if (!grouping) l += " ungrouped";
    if (statistic == NormStatistic::all_reduce) l += " norm-stat-allreduce";
    if (recompute != Recompute::none) l += fmt::format(" recompute={}", recompute_name(recompute));
    if (overlap) l += " tp-overlap";
    if (backward == TpBackward::serial) l += " serial-backward";
    return l;
  }
  // The same variant keeping every activation: what recomputation is measured against.
  bool is_baseline_of(const Variant& v) const {
    return mode == v.mode && grouping == v.grouping && statistic == v.statistic &&
           overlap == v.overlap && backward == v.backward && recompute == Recompute::none;
  }
};

// The full-rank model of the same widths, for `full`.
ModelConfig model_for(const ModelConfig& config, const TpLayout* mode) {
  return mode == full_mode() ? full_rank_model(config) : config;
}

// The policies worth measuring per mode: block for all, lowrank where it applies (btp).
std::vector<Recompute> recompute_policies(const TpLayout* mode) {
  if (mode == btp_mode()) return {Recompute::none, Recompute::block, Recompute::lowrank};
  return {Recompute::none, Recompute::block};
}

struct ComponentResult {
  Spread compute_ms, comm_ms;  // per step, forward + backward
};

struct ModeResult {
  Variant variant;
  const TpLayout* mode = nullptr;
  BottleneckKind kind = BottleneckKind::none;
  int64_t blocks = 0, tokens = 0;
  CommCounter fwd{}, bwd{};      // the mode's block sites, the last recorded step
  Spread iter, comm, recompute;  // ms per step over the recorded steps
  Spread comm_exposed;           // of comm, what the step waited for (the rest was hidden)
  double iter_ms() const { return iter.median; }
  double comm_ms() const { return comm.median; }
  double recompute_ms() const { return recompute.median; }
  Spread block_comm;             // the mode's block collectives per block and pass, ms
  CommCounter recompute_comm{};  // collectives issued while recomputing, one step
  // The optimizer's collectives (Muon's norms, Gram matrices and gathers), one step, and every
  // TP collective of the step, the optimizer's included.
  CommCounter optimizer_comm{}, step_comm{};
  // The optimizer's share of the step's TP elements.
  double optimizer_share() const {
    return step_comm.elements ? double(optimizer_comm.elements) / double(step_comm.elements) : 0;
  }
  MemoryBreakdown memory;  // this rank's buffers, all allocated up front
  // --components, vanilla and btp: per component name, and each call site's time per step.
  std::map<std::string, ComponentResult> components;
  std::map<std::string, Spread> site_ms, site_exposed_ms;
  size_t activation_bytes() const { return memory[MemoryTag::activations]; }
  size_t buffer_bytes() const { return memory[MemoryTag::comm]; }
  double fwd_per_token_block() const { return double(fwd.elements) / double(blocks * tokens); }
  double bwd_per_token_block() const { return double(bwd.elements) / double(blocks * tokens); }
  // Bytes: the elements' own (2 each in bf16, 4 in fp32, whatever statistics stay fp32).
  double fwd_bytes_per_token_block() const { return double(fwd.bytes) / double(blocks * tokens); }
  double bwd_bytes_per_token_block() const { return double(bwd.bytes) / double(blocks * tokens); }
};

// One variant's training step and timings. The variants' steps are interleaved (one step of
// each in turn), so that the machine's drift hits them alike.
class ModeRun {
 public:
  ModeRun(const TrainConfig& config, const Variant& variant, Communicator* tp, bool components)
      : variant_(variant), tp_(tp) {
    // --components: every op timed, each group's in the backend range its layout names
    // (TpLayout::components).
    be_ = make_backend("cpu");
    if (components) {
      auto profiled = std::make_unique<ProfilingBackend>(std::move(be_));
      profiler_ = profiled.get();
      be_ = std::move(profiled);
    }
    // The step of `bottle train` on this TP group, at the constant rate optimizer.lr, with the
    // variant's mode, grouping, RMSNorm statistic and policy.
    TrainConfig c = bench_step_config(config);
    c.model = model_for(config.model, variant.mode);
    c.parallel.tp_mode = variant.mode;
    c.parallel.grouping = variant.grouping;
    c.parallel.norm_statistic = variant.statistic;
    c.training.recompute = variant.recompute;
    c.parallel.tp_overlap = variant.overlap;
    c.parallel.tp_backward = variant.backward;
    const ModelConfig& model_config = c.model;
    train_step_ = std::make_unique<TrainStep>(c, *be_, tensor_parallel_of(c, tp), nullptr, nullptr);
    train_step_->model().init_weights(uint64_t(config.training.seed));
    train_step_->allocate_activations();
    // Random tokens, the same on every rank: the inputs [B, S], then the targets [B, S].
    std::mt19937 rng(uint32_t(config.training.seed));
    for (const Tensor& t : {train_step_->inputs()[0], train_step_->targets()[0]}) {
      std::vector<int32_t> tokens(size_t(t.numel()));
      for (int32_t& id : tokens) id = int32_t(rng() % uint32_t(model_config.vocab_size));
      be_->from_host(t, tokens.data());
    }
    result_.variant = variant;
    result_.mode = variant.mode;
    result_.kind = model_config.bottleneck;
    result_.blocks = model_config.num_layers;
    result_.tokens = c.training.micro_batch_size * c.training.seq_len;
    // Every buffer is allocated once, up front: this is the variant's footprint per rank.
    result_.memory = train_step_->model().memory();
    result_.memory[MemoryTag::optimizer] = train_step_->optimizer().bytes();
  }

  void step(bool record) {
    CommStats& stats = tp_ ? tp_->stats() : one_rank_;
    const std::string prefix = variant_.mode->name();
    if (tp_) tp_->barrier();
    stats.reset();
    if (profiler_) profiler_->reset();
    LlamaModel& model = train_step_->model();
    model.reset_recompute_seconds();
    const StepResult r = train_step_->step(steps_taken_++);
    double ms = r.seconds * 1e3;
    if (tp_ && tp_->size() > 1) {  // the slowest rank sets the pace
      float slowest = float(ms);
      tp_->all_reduce(host_tensor(std::span(&slowest, 1)), ReduceOp::max, "bench.time");
      ms = slowest;
    }
    double recompute_ms = model.recompute_seconds() * 1e3;
    if (tp_ && tp_->size() > 1) {
      float slowest = float(recompute_ms);
      tp_->all_reduce(host_tensor(std::span(&slowest, 1)), ReduceOp::max, "bench.time");
      recompute_ms = slowest;
    }
    if (!record) return;
    // The forward pass's sites (recomputation's carry kRecomputePhase in front).
    result_.fwd = stats.with_prefix(prefix + ".fwd.");
    result_.bwd = stats.with_prefix(prefix + ".bwd.");
    result_.recompute_comm = stats.with_prefix(kRecomputePhase);
    result_.optimizer_comm = stats.with_prefix(kOptimizerPhase);
    result_.step_comm = stats.total();
    const CommCounter bench = stats.with_prefix("bench.");
    result_.step_comm.calls -= bench.calls;
    result_.step_comm.elements -= bench.elements;
    result_.step_comm.bytes -= bench.bytes;
    iter_.push_back(ms);
    recompute_.push_back(recompute_ms);
    block_comm_.push_back((result_.fwd.seconds + result_.bwd.seconds) * 1e3 /
                          double(2 * result_.blocks));
    comm_.push_back((stats.total().seconds - stats.with_prefix("bench.").seconds) * 1e3);
    comm_exposed_.push_back(
        (stats.total().exposed_seconds - stats.with_prefix("bench.").exposed_seconds) * 1e3);
    if (profiler_ && !variant_.mode->components().empty()) record_components(stats);
  }

  // Medians, minima and maxima over the recorded steps.
  const ModeResult& result() {
    result_.iter = spread_of(iter_);
    result_.comm = spread_of(comm_);
    result_.comm_exposed = spread_of(comm_exposed_);
    result_.recompute = spread_of(recompute_);
    result_.block_comm = spread_of(block_comm_);
    for (const auto& [name, ms] : component_compute_)
      result_.components[name].compute_ms = spread_of(ms);
    for (const auto& [name, ms] : component_comm_) result_.components[name].comm_ms = spread_of(ms);
    for (const auto& [site, ms] : site_ms_) result_.site_ms[site] = spread_of(ms);
    for (const auto& [site, ms] : site_exposed_ms_) result_.site_exposed_ms[site] = spread_of(ms);
    return result_;
  }

 private:
  Variant variant_;
  Communicator* tp_;
  std::unique_ptr<Backend> be_;
  ProfilingBackend* profiler_ = nullptr;  // be_ under --components
  std::unique_ptr<TrainStep> train_step_;
  int64_t steps_taken_ = 0;
  CommStats one_rank_;  // stays empty: one rank communicates nothing
  ModeResult result_;
  std::vector<double> iter_, comm_, comm_exposed_, recompute_, block_comm_;
  std::map<std::string, std::vector<double>> component_compute_, component_comm_, site_ms_,
      site_exposed_ms_;

  // This rank's times (as comm_ms: its communicator's, not the slowest rank's).
  void record_components(const CommStats& stats) {
    const std::map<std::string, KernelTime>& ranges = profiler_->range_times();
    for (const TpComponent& c : variant_.mode->components()) {
      const auto range = ranges.find(c.name);
      component_compute_[c.name].push_back(range == ranges.end() ? 0.0 : range->second.ms);
      double comm = 0;
      for (const std::string& site : c.sites)
        if (const auto it = stats.by_site().find(site); it != stats.by_site().end())
          comm += it->second.seconds;
      component_comm_[c.name].push_back(comm * 1e3);
    }
    for (const auto& [site, counter] : stats.by_site())
      if (!site.starts_with("bench.")) {
        site_ms_[site].push_back(counter.seconds * 1e3);
        site_exposed_ms_[site].push_back(counter.exposed_seconds * 1e3);
      }
  }
};

// --fit: the largest micro-batch (up to `max_batch`) whose planned footprint on every rank
// of `world` stays within `limit`, and that footprint; 0 when not even 1 fits.
struct Fit {
  int64_t batch = 0;
  MemoryBreakdown memory;  // the largest rank's, at `batch` (at 1 when none fits)
};

Fit largest_fitting_batch(const TrainConfig& config, const Variant& v, Communicator* tp,
                          Communicator& world, int64_t limit, int64_t max_batch) {
  Fit fit;
  for (int64_t batch = 1; batch <= max_batch; ++batch) {
    TrainConfig c = config;
    c.model = model_for(config.model, v.mode);
    c.training.micro_batch_size = batch;
    c.training.recompute = v.recompute;
    const MemoryBreakdown mine = plan_rank_memory(
        c, TensorParallel{v.mode, tp, v.grouping, v.statistic}, PipelineStage{}, 1);
    MemoryBreakdown largest;
    for (const auto& sizes : gather_sizes(world, mine.bytes)) {
      MemoryBreakdown r;
      std::copy(sizes.begin(), sizes.end(), r.bytes.begin());
      if (r.total() > largest.total()) largest = r;
    }
    if (largest.total() > size_t(limit)) {
      if (batch == 1) fit.memory = largest;
      break;
    }
    fit = Fit{batch, largest};
  }
  return fit;
}

void print_fit_table(const TrainConfig& config, const std::string& path, Communicator* tp,
                     Communicator& world, int64_t limit, int64_t max_batch, bool json) {
  const bool leader = world.rank() == 0;
  const ModelConfig& m = config.model;
  if (leader && !json)
    fmt::print(
        "bench tp --fit: {}, tp {}, {} model d={} d_ff={} H={} r={} L={} V={}, "
        "sequence {}, {}; planned per rank (weights, gradients, AdamW moments, activations "
        "and buffers) under {}, micro-batches 1..{}\n"
        "  {:<28} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12}\n",
        path, config.parallel.tp, bottleneck_kind_name(m.bottleneck), m.hidden_size,
        m.intermediate_size, m.num_heads, m.rank, m.num_layers, m.vocab_size,
        config.training.seq_len, enum_name(config.training.precision), format_bytes(size_t(limit)),
        max_batch, "mode", "max batch", "weights", "gradients", "optimizer", "act+buffers",
        "total");
  std::vector<const TpLayout*> modes{full_mode()};
  if (m.bottleneck != BottleneckKind::none) modes = {full_mode(), vanilla_mode(), btp_mode()};
  for (const TpLayout* mode : modes)
    for (Recompute policy : recompute_policies(mode)) {
      const Variant v{mode, config.parallel.grouping, NormStatistic::from_latent, policy};
      const Fit fit = largest_fitting_batch(config, v, tp, world, limit, max_batch);
      if (!leader) continue;
      const MemoryBreakdown& b = fit.memory;
      const size_t act = b[MemoryTag::activations] + b[MemoryTag::comm];
      if (json) {
        const FitRow row{.fit_limit_bytes = limit,
                         .mode = mode->name(),
                         .recompute = recompute_name(policy),
                         .tp = config.parallel.tp,
                         .seq_len = config.training.seq_len,
                         .max_micro_batch = fit.batch,
                         .tried_up_to = max_batch,
                         .weights_bytes = b[MemoryTag::weights],
                         .gradients_bytes = b[MemoryTag::gradients],
                         .optimizer_bytes = b[MemoryTag::optimizer],
                         .activation_and_buffer_bytes = act,
                         .total_bytes = b.total()};
        fmt::print("{}\n", to_json(row).dump());
      } else {
        fmt::print("  {:<28} {:>10} {:>12} {:>12} {:>12} {:>12} {:>12}{}\n", v.label(),
                   fit.batch ? std::to_string(fit.batch) : "none",
                   format_bytes(b[MemoryTag::weights]), format_bytes(b[MemoryTag::gradients]),
                   format_bytes(b[MemoryTag::optimizer]), format_bytes(act),
                   format_bytes(b.total()), fit.batch ? "" : "  (at micro-batch 1: does not fit)");
      }
      std::fflush(stdout);
    }
}

// The other order of the TP backward.
TpBackward other(TpBackward order) {
  return order == TpBackward::async ? TpBackward::serial : TpBackward::async;
}

// The variants bench tp times: each mode as configured (with --tp-overlap also with TP overlap
// on, with --tp-backward also with the other parallel.tp_backward), with --variants grouping
// switched and btp's RMSNorm statistic all-reduced, with --recompute every other policy of
// each. Every variant runs the configured order of the TP backward but the --tp-backward ones.
std::vector<Variant> bench_variants(const std::vector<const TpLayout*>& modes, bool grouping,
                                    Recompute base, bool bottleneck, const BenchTpOptions& o,
                                    TpBackward order) {
  const NormStatistic latent = NormStatistic::from_latent;
  std::vector<Variant> variants;
  for (const TpLayout* mode : modes) {
    variants.push_back({mode, grouping, latent, base, false, order});
    if (o.tp_overlap) variants.push_back({mode, grouping, latent, base, true, order});
    if (o.tp_backward) variants.push_back({mode, grouping, latent, base, false, other(order)});
  }
  if (bottleneck && o.variants) {
    variants.push_back({vanilla_mode(), !grouping, latent, base, false, order});
    variants.push_back({btp_mode(), !grouping, latent, base, false, order});
    variants.push_back({btp_mode(), grouping, NormStatistic::all_reduce, base, false, order});
  }
  if (o.recompute) {
    const std::vector<Variant> kept = variants;
    for (const Variant& v : kept)
      if (v.statistic == latent && v.grouping == grouping && !v.overlap && v.backward == order)
        for (Recompute policy : recompute_policies(v.mode))
          if (policy != base)
            variants.push_back({v.mode, v.grouping, v.statistic, policy, false, order});
  }
  return variants;
}

// Recomputation against the same variant keeping everything: activation memory saved, and the
// time recomputing took (measured around the recomputation itself, and as the difference of
// the iteration medians).
struct Saving {
  double saved_mb = 0, extra_ms = 0, mb_per_ms = 0;
};
Saving saving_of(const std::vector<ModeResult>& results, const ModeResult& r) {
  Saving s;
  for (const ModeResult& base : results)
    if (base.variant.is_baseline_of(r.variant) && r.variant.recompute != Recompute::none) {
      s.saved_mb = (double(base.activation_bytes()) - double(r.activation_bytes())) / 1e6;
      s.extra_ms = r.iter_ms() - base.iter_ms();
      s.mb_per_ms = r.recompute_ms() > 0 ? s.saved_mb / r.recompute_ms() : 0;
    }
  return s;
}

// One variant's result as its record; `per_rank`: every rank's bytes per tag.
TpRow result_row(const ModeResult& r, const Saving& saved, int tp, Precision precision,
                 const std::vector<std::vector<size_t>>& per_rank) {
  const double blocks = double(r.blocks);
  TpRow row{.mode = r.mode->name(),
            .variant = r.variant.label(),
            .grouping = r.variant.grouping,
            .model = bottleneck_kind_name(r.kind),
            .tp = tp,
            .recompute = recompute_name(r.variant.recompute),
            .tp_overlap = r.variant.overlap,
            .tp_backward = enum_name(r.variant.backward),
            .precision = enum_name(precision),
            .fwd_elems_per_block = double(r.fwd.elements) / blocks,
            .bwd_elems_per_block = double(r.bwd.elements) / blocks,
            .fwd_elems_per_token_block = r.fwd_per_token_block(),
            .bwd_elems_per_token_block = r.bwd_per_token_block(),
            .fwd_bytes_per_token_block = r.fwd_bytes_per_token_block(),
            .bwd_bytes_per_token_block = r.bwd_bytes_per_token_block(),
            .collectives_per_block = double(r.fwd.calls) / blocks,
            .bwd_collectives_per_block = double(r.bwd.calls) / blocks,
            .recompute_collectives = double(r.recompute_comm.calls) / blocks,
            .recompute_elems_per_block = double(r.recompute_comm.elements) / blocks,
            .optimizer_elements = double(r.optimizer_comm.elements),
            .optimizer_collectives = double(r.optimizer_comm.calls),
            .optimizer_share = r.optimizer_share(),
            .fwd_comm_ms_per_block = r.fwd.seconds * 1e3 / blocks,
            .bwd_comm_ms_per_block = r.bwd.seconds * 1e3 / blocks,
            .comm_exposed_ms = r.comm_exposed.median,
            .compute_ms = r.iter_ms() - r.comm_exposed.median,
            .tokens_per_s = double(r.tokens) / (r.iter_ms() / 1e3),
            .peak_bytes = r.memory.total(),
            .weights_bytes = r.memory[MemoryTag::weights],
            .gradients_bytes = r.memory[MemoryTag::gradients],
            .optimizer_bytes = r.memory[MemoryTag::optimizer],
            .activation_bytes = r.activation_bytes(),
            .buffer_bytes = r.buffer_bytes(),
            .saved_mb = saved.saved_mb,
            .extra_ms = saved.extra_ms,
            .saved_mb_per_ms = saved.mb_per_ms,
            .memory_per_rank = {},
            .iter_ms = r.iter,
            .comm_ms = r.comm,
            .recompute_ms = r.recompute,
            .block_comm_ms_per_pass = r.block_comm,
            .components = {},
            .comm_ms_by_site = std::nullopt,
            .comm_exposed_ms_by_site = std::nullopt};
  for (size_t tag = 0; tag < size_t(MemoryTag::count); ++tag)
    for (const auto& rank : per_rank) row.memory_per_rank[tag].push_back(rank[tag]);
  for (const TpComponent& component : r.mode->components())
    if (const auto it = r.components.find(component.name); it != r.components.end())
      row.components.push_back({component.name, it->second.compute_ms, it->second.comm_ms});
  if (!r.site_ms.empty()) {
    row.comm_ms_by_site.emplace();
    row.comm_exposed_ms_by_site.emplace();
    for (const auto& [site, s] : r.site_ms) (*row.comm_ms_by_site)[site] = s.median;
    for (const auto& [site, s] : r.site_exposed_ms) (*row.comm_exposed_ms_by_site)[site] = s.median;
  }
  return row;
}

// One variant's result as one line of text.
void print_result_line(const ModeResult& r, const Saving& saved) {
  const double blocks = double(r.blocks);
  fmt::print(
      "  {:<34} {:<5} fwd {:>9.0f} bwd {:>9.0f} elements ({:>9.0f} + {:>9.0f} bytes) per token and "
      "block ({:>4.1f} + {:>4.1f} collectives, {:>4.1f} recomputed) | iter {:>8.1f} ms (comm "
      "{:>6.1f}, compute {:>8.1f}, recompute {:>6.1f}) {:>8.0f} tokens/s | total {:>9}, "
      "activations {:>9}, buffers {:>9}",
      r.variant.label(), bottleneck_kind_name(r.kind), r.fwd_per_token_block(),
      r.bwd_per_token_block(), r.fwd_bytes_per_token_block(), r.bwd_bytes_per_token_block(),
      double(r.fwd.calls) / blocks, double(r.bwd.calls) / blocks,
      double(r.recompute_comm.calls) / blocks, r.iter_ms(), r.comm_ms(), r.iter_ms() - r.comm_ms(),
      r.recompute_ms(), double(r.tokens) / (r.iter_ms() / 1e3), format_bytes(r.memory.total()),
      format_bytes(r.activation_bytes()), format_bytes(r.buffer_bytes()));
  fmt::print(" | iter min {:.1f} max {:.1f} ms", r.iter.min, r.iter.max);
  for (const TpComponent& component : r.mode->components())
    if (const auto it = r.components.find(component.name); it != r.components.end())
      fmt::print(" | {} compute {:.2f} comm {:.2f} ms", component.name,
                 it->second.compute_ms.median, it->second.comm_ms.median);
  if (r.optimizer_comm.calls)
    fmt::print(
        " | optimizer {} elements in {} collectives per step ({:.2f}% of the step's TP "
        "elements)",
        r.optimizer_comm.elements, r.optimizer_comm.calls, 100 * r.optimizer_share());
  if (r.variant.recompute != Recompute::none)
    fmt::print(" | saves {:.1f} MB for {:.1f} ms: {:.1f} MB/ms (iteration +{:.1f} ms)",
               saved.saved_mb, r.recompute_ms(), saved.mb_per_ms, saved.extra_ms);
  fmt::print("\n");
}

// The variant of `mode` as configured (grouping, the latent's statistic, the TP backward's
// order) under `policy`.
const ModeResult* find_result(const std::vector<ModeResult>& results, const TpLayout* mode,
                              Recompute policy, bool grouping, TpBackward order) {
  for (const ModeResult& r : results)
    if (r.mode == mode && r.variant.grouping == grouping &&
        r.variant.statistic == NormStatistic::from_latent && r.variant.recompute == policy &&
        !r.variant.overlap && r.variant.backward == order)
      return &r;
  return nullptr;
}

// The comparisons after the table: volumes and speedups against full-rank TP and vanilla,
// memory, recomputation's MB per ms, grouping and the RMSNorm statistic, each against the
// paper's figure where it gives one.
void print_comparisons(const std::vector<ModeResult>& results, Recompute base, bool grouping,
                       TpBackward order) {
  const PaperFigures paper = PaperFigures::built_in();  // reference/boost_paper.toml
  auto find = [&](const TpLayout* mode, Recompute policy) {
    return find_result(results, mode, policy, grouping, order);
  };
  auto saving = [&](const ModeResult& r) { return saving_of(results, r); };
  const ModeResult *full = find(full_mode(), base), *vanilla = find(vanilla_mode(), base),
                   *btp = find(btp_mode(), base);
  if (vanilla && btp) {
    fmt::print(
        "  forward volume vs full-rank TP: vanilla {:.3f}x, btp {:.3f}x | btp iteration speedup: "
        "{:.2f}x vs vanilla, {:.2f}x vs full-rank TP\n",
        vanilla->fwd_per_token_block() / full->fwd_per_token_block(),
        btp->fwd_per_token_block() / full->fwd_per_token_block(),
        vanilla->iter_ms() / btp->iter_ms(), full->iter_ms() / btp->iter_ms());
    auto buffers = [](const ModeResult* r) {
      return double(r->activation_bytes() + r->buffer_bytes());
    };
    const double paper_boost = paper.value("memory.activations_boost"),
                 paper_vanilla = paper.value("memory.activations_vanilla");
    fmt::print(
        "  activations + buffers per rank, recompute \"{}\": btp {} vs vanilla {} = {:.3f}x "
        "(paper, no recomputation, {}: {:.2f} / {:.2f} GB = {:.2f}x)\n",
        recompute_name(base), format_bytes(size_t(buffers(btp))),
        format_bytes(size_t(buffers(vanilla))), buffers(btp) / buffers(vanilla),
        paper.text("memory.setting"), paper_boost, paper_vanilla, paper_boost / paper_vanilla);
    const ModeResult *lowrank = find(btp_mode(), Recompute::lowrank),
                     *vanilla_block = find(vanilla_mode(), Recompute::block);
    if (lowrank && vanilla_block)
      fmt::print(
          "  recomputation: btp lowrank {:.1f} MB/ms vs vanilla block {:.1f} MB/ms = {:.2f}x "
          "(paper, {}: {:.1f} / {:.1f} = {:.2f}x)\n",
          saving(*lowrank).mb_per_ms, saving(*vanilla_block).mb_per_ms,
          saving(*lowrank).mb_per_ms / saving(*vanilla_block).mb_per_ms,
          paper.text("recompute.setting"), paper.value("recompute.boost_batch4"),
          paper.value("recompute.vanilla_batch4"), paper.value("recompute.boost_advantage_batch4"));
    const ModeResult *vanilla_ungrouped = nullptr, *btp_ungrouped = nullptr, *stat = nullptr;
    for (const ModeResult& r : results) {
      if (r.variant.recompute != base || r.variant.overlap || r.variant.backward != order) continue;
      if (r.variant.grouping != grouping)
        (r.mode == vanilla_mode() ? vanilla_ungrouped : btp_ungrouped) = &r;
      if (r.variant.statistic == NormStatistic::all_reduce) stat = &r;
    }
    if (vanilla_ungrouped && btp_ungrouped && stat)
      fmt::print(
          "  grouping speedup: vanilla {:.2f}x, btp {:.2f}x | btp with RMSNorm's backward "
          "statistic all-reduced: {:.3f}x the time of taking it from the latent\n",
          std::pow(vanilla_ungrouped->iter_ms() / vanilla->iter_ms(), grouping ? 1 : -1),
          std::pow(btp_ungrouped->iter_ms() / btp->iter_ms(), grouping ? 1 : -1),
          stat->iter_ms() / btp->iter_ms());
    // BOOST's grouping table: each group's compute and all-reduce, grouped vs not.
    for (const auto& [grouped, ungrouped] :
         {std::pair{vanilla, vanilla_ungrouped}, {btp, btp_ungrouped}}) {
      if (!ungrouped || grouped->components.empty()) continue;
      const ModeResult& on = grouping ? *grouped : *ungrouped;
      const ModeResult& off = grouping ? *ungrouped : *grouped;
      fmt::print("  {} grouping on vs off, ms per step:", on.mode->name());
      for (const TpComponent& c : on.mode->components()) {
        const ComponentResult &a = on.components.at(c.name), &b = off.components.at(c.name);
        fmt::print(" {} compute {:.2f} vs {:.2f}, all-reduce {:.2f} vs {:.2f} |", c.name,
                   a.compute_ms.median, b.compute_ms.median, a.comm_ms.median, b.comm_ms.median);
      }
      fmt::print(" iteration {:.1f} vs {:.1f}\n", on.iter_ms(), off.iter_ms());
    }
  }
  // --tp-overlap: each mode's serial iteration over its overlapped one, and how much of the
  // serial step its TP communication was (what overlap can hide at most).
  std::string overlap_line;
  for (const TpLayout* mode : {full_mode(), vanilla_mode(), btp_mode()}) {
    const ModeResult* serial = find(mode, base);
    const ModeResult* halves = nullptr;
    for (const ModeResult& r : results)
      if (r.mode == mode && r.variant.overlap && r.variant.recompute == base) halves = &r;
    if (!serial || !halves) continue;
    overlap_line += fmt::format(
        " {} {:.2f}x (serial comm {:.0f} % of the step, exposed under "
        "overlap {:.1f} of {:.1f} ms) |",
        mode->name(), serial->iter_ms() / halves->iter_ms(),
        100.0 * serial->comm_ms() / serial->iter_ms(), halves->comm_exposed.median,
        halves->comm_ms());
  }
  if (!overlap_line.empty())
    fmt::print("  tp_overlap speedup (serial / overlapped iteration):{}\n",
               overlap_line.substr(0, overlap_line.size() - 2));
  // --tp-backward: each mode's iteration with the input gradients' all-reduces after the weight
  // gradients over its iteration with them under the weight gradients (Megatron's order), the
  // TP communication the step waited for in each, and btp's speedup over full-rank TP with
  // both in each order: what the paper's ratio is when `full` is Megatron at its best.
  std::string order_line;
  std::map<const TpLayout*, std::pair<const ModeResult*, const ModeResult*>> by_order;
  for (const TpLayout* mode : {full_mode(), vanilla_mode(), btp_mode()}) {
    const ModeResult *async = find_result(results, mode, base, grouping, TpBackward::async),
                     *serial = find_result(results, mode, base, grouping, TpBackward::serial);
    if (!async || !serial) continue;
    by_order[mode] = {serial, async};
    order_line += fmt::format(
        " {} {:.2f}x (TP comm waited for: serial {:.1f} of {:.1f} ms, async {:.1f} of {:.1f}) |",
        mode->name(), serial->iter_ms() / async->iter_ms(), serial->comm_exposed.median,
        serial->comm_ms(), async->comm_exposed.median, async->comm_ms());
  }
  if (!order_line.empty())
    fmt::print("  tp_backward speedup (serial / async iteration):{}\n",
               order_line.substr(0, order_line.size() - 2));
  if (by_order.count(full_mode()) && by_order.count(btp_mode())) {
    const auto [full_serial, full_async] = by_order[full_mode()];
    const auto [btp_serial, btp_async] = by_order[btp_mode()];
    fmt::print(
        "  btp iteration speedup vs full-rank TP: {:.2f}x with both serial, {:.2f}x with both "
        "async (full at Megatron's order), {:.2f}x btp async vs full serial\n",
        full_serial->iter_ms() / btp_serial->iter_ms(),
        full_async->iter_ms() / btp_async->iter_ms(),
        full_serial->iter_ms() / btp_async->iter_ms());
  }
}

// Each mode must take the configuration's policy: lowrank applies to btp alone.
void check_recompute_policy(const std::vector<const TpLayout*>& modes, Recompute base,
                            const BenchTpOptions& o) {
  for (const TpLayout* mode : modes) {
    const auto policies = recompute_policies(mode);
    BOTTLE_CHECK(std::find(policies.begin(), policies.end(), base) != policies.end(),
                 "{}: key 'training.recompute' = \"{}\" applies to btp only, and bench tp "
                 "times {} too; set \"none\" or \"block\" (--recompute adds \"lowrank\" "
                 "for btp)",
                 o.recompute_from_set ? "--set" : o.config_path, recompute_name(base),
                 mode->name());
  }
}

}  // namespace

void run_bench_tp(const TrainConfig& config, const BenchTpOptions& o) {
  Communicator& world = world_communicator();
  ProcessGroups groups = ProcessGroups::create(
      world, {int(config.parallel.tp), int(config.parallel.pp), int(config.parallel.dp)});
  BOTTLE_CHECK(config.parallel.pp == 1 && config.parallel.dp == 1,
               "bench tp: set parallel.pp = parallel.dp = 1 (it measures one TP group)");
  if (!o.fit.empty()) {
    const auto limit = parse_byte_size(o.fit);
    BOTTLE_CHECK(limit && *limit > 0, "--fit: '{}' is not a byte size (such as \"80GiB\")", o.fit);
    print_fit_table(config, o.config_path, groups.tp.get(), world, *limit, o.fit_max, o.json);
    return;
  }
  omp_set_num_threads(o.threads > 0 ? o.threads : std::max(1, omp_get_num_procs() / world.size()));
  const bool grouping = config.parallel.grouping;
  // The policy every mode runs under; each mode must take it.
  const Recompute base = config.training.recompute;
  std::vector<const TpLayout*> modes{full_mode()};
  if (config.model.bottleneck != BottleneckKind::none)
    modes = {full_mode(), vanilla_mode(), btp_mode()};
  check_recompute_policy(modes, base, o);
  BOTTLE_CHECK(!o.tp_overlap || config.training.micro_batch_size % 2 == 0,
               "bench tp --tp-overlap splits each micro-batch into two halves of its "
               "sequences: it needs an even training.micro_batch_size, not {}",
               config.training.micro_batch_size);
  const std::vector<Variant> variants =
      bench_variants(modes, grouping, base, config.model.bottleneck != BottleneckKind::none, o,
                     config.parallel.tp_backward);
  const bool leader = world.rank() == 0;
  const ModelConfig& m = config.model;
  if (leader && !o.json)
    fmt::print(
        "bench tp: {}, {} rank(s), {} model d={} d_ff={} H={} r={} L={}, "
        "b={} s={}, {}, grouping {}, recompute \"{}\", {} thread(s) per rank; full = the "
        "full-rank model of the same widths\n",
        o.config_path, world.size(), bottleneck_kind_name(m.bottleneck), m.hidden_size,
        m.intermediate_size, m.num_heads, m.rank, m.num_layers, config.training.micro_batch_size,
        config.training.seq_len, enum_name(config.training.precision),
        config.parallel.grouping ? "on" : "off", recompute_name(base), omp_get_max_threads());
  std::vector<std::unique_ptr<ModeRun>> runs;
  for (const Variant& variant : variants) {
    runs.push_back(std::make_unique<ModeRun>(config, variant, groups.tp.get(), o.components));
    for (int i = 0; i < o.warmup; ++i) runs.back()->step(false);
  }
  for (int i = 0; i < o.steps; ++i)
    for (auto& run : runs) run->step(true);
  std::vector<ModeResult> results;
  for (auto& run : runs) results.push_back(run->result());
  // Every rank's bytes per tag, per variant (a collective: every rank takes part).
  std::vector<std::vector<std::vector<size_t>>> per_rank;
  for (const ModeResult& r : results) per_rank.push_back(gather_sizes(world, r.memory.bytes));
  for (const ModeResult& r : results) {
    if (!leader) break;
    const Saving saved = saving_of(results, r);
    if (o.json)
      fmt::print("{}\n", to_json(result_row(r, saved, world.size(), config.training.precision,
                                            per_rank[size_t(&r - results.data())]))
                             .dump());
    else
      print_result_line(r, saved);
    std::fflush(stdout);
  }
  if (leader && !o.json) print_comparisons(results, base, grouping, config.parallel.tp_backward);
}

}  // namespace bottle
