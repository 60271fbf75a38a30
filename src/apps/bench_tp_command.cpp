// `bottle bench tp`: the three tensor-parallel modes on the same model, side by side in one
// run (under mpirun -np t): full-rank Megatron TP on the full-rank model of the same widths,
// vanilla low-rank TP and BTP on the bottleneck model. Per mode: the communicator's exact
// per-block volumes and collective counts, and the training step's time split into
// communication and compute, tokens/s and peak memory per rank.
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>

#include "apps/commands.h"
#include "comm/process_groups.h"
#include "model/llama.h"
#include "train/adamw.h"
#include "train/train_config.h"

namespace bottle {
namespace {

using Clock = std::chrono::steady_clock;

struct Variant {
  TpMode mode;
  bool grouping;
  NormStatistic statistic = NormStatistic::from_latent;
  std::string label() const {
    std::string l = tp_mode_name(mode);
    if (!grouping) l += " ungrouped";
    if (statistic == NormStatistic::all_reduce) l += " norm-stat-allreduce";
    return l;
  }
};

struct ModeResult {
  Variant variant;
  TpMode mode;
  BottleneckKind kind;
  int64_t blocks = 0, tokens = 0;
  CommCounter fwd{}, bwd{};  // the mode's block sites, one step
  double iter_ms = 0, comm_ms = 0;
  size_t peak_bytes = 0, activation_bytes = 0;
  double fwd_per_token_block() const { return double(fwd.elements) / double(blocks * tokens); }
  double bwd_per_token_block() const { return double(bwd.elements) / double(blocks * tokens); }
};

// One variant's model, optimizer and timings. The variants' steps are interleaved (one
// step of each in turn), so that the machine's drift hits them alike.
class ModeRun {
 public:
  ModeRun(const TrainConfig& config, const Variant& variant, Communicator* tp)
      : config_(config), variant_(variant), tp_(tp) {
    ModelConfig model_config = config.model;
    if (variant.mode == TpMode::full) {
      // The full-rank model of the same widths.
      model_config.bottleneck = BottleneckKind::none;
      model_config.rank = 0;
      model_config.ranks = {};
      model_config.mlp_gate_act.reset();
    }
    const int64_t B = config.training.micro_batch_size, S = config.training.seq_len;
    model_ = std::make_unique<LlamaModel>(
        model_config, TensorParallel{variant.mode, tp, variant.grouping, variant.statistic});
    model_->init_weights(uint64_t(config.training.seed));
    model_->allocate_activations(B, S);
    optimizer_ = std::make_unique<AdamW>(model_->parameters(), config.adamw());
    std::mt19937 rng(uint32_t(config.training.seed));
    tokens_.resize(size_t(2 * B * S));
    for (auto& t : tokens_) t = int32_t(rng() % uint32_t(model_config.vocab_size));
    result_ =
        ModeResult{variant, variant.mode, model_config.bottleneck, model_config.num_layers, B * S};
    // Every buffer is allocated once, up front: this is the mode's footprint per rank.
    const size_t param_bytes = size_t(model_->parameters().count()) * sizeof(float);
    result_.activation_bytes = model_->activation_bytes();
    result_.peak_bytes = 4 * param_bytes + result_.activation_bytes;  // w, grad, 2 moments
  }

  void step(bool record) {
    const int64_t B = config_.training.micro_batch_size, S = config_.training.seq_len;
    Tensor tok{tokens_.data(), {B, S}, DType::i32}, tgt{tokens_.data() + B * S, {B, S}, DType::i32};
    CommStats& stats = tp_ ? tp_->stats() : one_rank_;
    const std::string prefix = tp_mode_name(variant_.mode);
    if (tp_) tp_->barrier();
    stats.reset();
    const auto t0 = Clock::now();
    model_->zero_grad(*be_);
    model_->forward(*be_, tok, tgt);
    const CommCounter fwd = stats.with_prefix(prefix + ".fwd.");
    model_->backward(*be_, tok, tgt);
    const double norm = std::sqrt(model_->grad_sum_squares(*be_));
    optimizer_->step(*be_, model_->parameters(), float(config_.optimizer.lr),
                     norm > 1.0 ? float(1.0 / norm) : 1.0f);
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    if (tp_ && tp_->size() > 1) {  // the slowest rank sets the pace
      float slowest = float(ms);
      tp_->all_reduce(Tensor{&slowest, {1}}, ReduceOp::max, "bench.time");
      ms = slowest;
    }
    if (!record) return;
    result_.fwd = fwd;
    result_.bwd = stats.with_prefix(prefix + ".bwd.");
    iter_.push_back(ms);
    comm_.push_back((stats.total().seconds - stats.with_prefix("bench.").seconds) * 1e3);
  }

  // Medians over the recorded steps.
  const ModeResult& result() {
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    result_.iter_ms = median(iter_);
    result_.comm_ms = median(comm_);
    return result_;
  }

 private:
  const TrainConfig& config_;
  Variant variant_;
  Communicator* tp_;
  std::unique_ptr<Backend> be_ = make_backend("cpu");
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::vector<int32_t> tokens_;  // inputs, then targets
  CommStats one_rank_;           // stays empty: one rank communicates nothing
  ModeResult result_;
  std::vector<double> iter_, comm_;
};

}  // namespace

Command add_bench_tp_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::vector<std::string> overrides;
    int steps = 5, warmup = 2, threads = 0;
    bool json = false, variants = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("config", o->config, "training configuration (TOML)")->required();
  app.add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  app.add_option("--steps", o->steps, "timed steps per mode")->check(CLI::PositiveNumber);
  app.add_option("--warmup", o->warmup, "untimed steps first")->check(CLI::NonNegativeNumber);
  app.add_option("--threads", o->threads, "OpenMP threads per rank (default: cores / ranks)");
  app.add_flag("--json", o->json, "one JSON object per mode and line");
  app.add_flag("--variants", o->variants,
               "also time vanilla and btp with grouping switched, and btp with RMSNorm's "
               "backward statistic all-reduced instead of taken from the latent");
  return [o] {
    Communicator& world = world_communicator();
    std::vector<std::string> overrides = o->overrides;
    // The TP degree is the job's size unless the configuration or --set says otherwise.
    const bool tp_given = std::any_of(overrides.begin(), overrides.end(), [](const auto& s) {
      return s.rfind("parallel.tp=", 0) == 0;
    });
    if (!tp_given) overrides.push_back(fmt::format("parallel.tp={}", world.size()));
    const TrainConfig config = load_train_config(o->config, overrides);
    ProcessGroups groups = ProcessGroups::create(
        world, {int(config.parallel.tp), int(config.parallel.pp), int(config.parallel.dp)});
    BOTTLE_CHECK(config.parallel.pp == 1 && config.parallel.dp == 1,
                 "bench tp: set parallel.pp = parallel.dp = 1 (it measures one TP group)");
    omp_set_num_threads(o->threads > 0 ? o->threads
                                       : std::max(1, omp_get_num_procs() / world.size()));
    const bool grouping = config.parallel.grouping;
    std::vector<Variant> variants{{TpMode::full, grouping}};
    if (config.model.bottleneck != BottleneckKind::none) {
      variants.push_back({TpMode::vanilla, grouping});
      variants.push_back({TpMode::btp, grouping});
      if (o->variants) {
        variants.push_back({TpMode::vanilla, !grouping});
        variants.push_back({TpMode::btp, !grouping});
        variants.push_back({TpMode::btp, grouping, NormStatistic::all_reduce});
      }
    }
    const bool leader = world.rank() == 0;
    const ModelConfig& m = config.model;
    if (leader && !o->json)
      std::printf(
          "bench tp: %s, %d rank(s), %s model d=%lld d_ff=%lld H=%lld r=%lld L=%lld, "
          "b=%lld s=%lld, grouping %s, %d thread(s) per rank; full = the full-rank model of "
          "the same widths\n",
          o->config.c_str(), world.size(), bottleneck_kind_name(m.bottleneck),
          (long long)m.hidden_size, (long long)m.intermediate_size, (long long)m.num_heads,
          (long long)m.rank, (long long)m.num_layers, (long long)config.training.micro_batch_size,
          (long long)config.training.seq_len, config.parallel.grouping ? "on" : "off",
          omp_get_max_threads());
    std::vector<std::unique_ptr<ModeRun>> runs;
    for (const Variant& variant : variants) {
      runs.push_back(std::make_unique<ModeRun>(config, variant, groups.tp.get()));
      for (int i = 0; i < o->warmup; ++i) runs.back()->step(false);
    }
    for (int i = 0; i < o->steps; ++i)
      for (auto& run : runs) run->step(true);
    std::vector<ModeResult> results;
    for (auto& run : runs) {
      results.push_back(run->result());
      const ModeResult& r = results.back();
      if (!leader) continue;
      const double blocks = double(r.blocks);
      if (o->json) {
        nlohmann::ordered_json j{{"mode", tp_mode_name(r.mode)},
                                 {"variant", r.variant.label()},
                                 {"grouping", r.variant.grouping},
                                 {"model", bottleneck_kind_name(r.kind)},
                                 {"tp", world.size()},
                                 {"recompute", "none"},
                                 {"fwd_elems_per_block", double(r.fwd.elements) / blocks},
                                 {"bwd_elems_per_block", double(r.bwd.elements) / blocks},
                                 {"fwd_elems_per_token_block", r.fwd_per_token_block()},
                                 {"bwd_elems_per_token_block", r.bwd_per_token_block()},
                                 {"collectives_per_block", double(r.fwd.calls) / blocks},
                                 {"bwd_collectives_per_block", double(r.bwd.calls) / blocks},
                                 {"recompute_collectives", 0},
                                 {"comm_ms", r.comm_ms},
                                 {"compute_ms", r.iter_ms - r.comm_ms},
                                 {"iter_ms", r.iter_ms},
                                 {"tokens_per_s", double(r.tokens) / (r.iter_ms / 1e3)},
                                 {"peak_bytes", r.peak_bytes},
                                 {"activation_bytes", r.activation_bytes}};
        std::printf("%s\n", j.dump().c_str());
      } else {
        std::printf(
            "  %-28s %-5s fwd %9.0f bwd %9.0f elements per token and block (%4.1f + %4.1f "
            "collectives) | iter %8.1f ms (comm %6.1f, compute %8.1f) %8.0f tokens/s | peak "
            "%7.1f MB, activations %7.1f MB\n",
            r.variant.label().c_str(), bottleneck_kind_name(r.kind), r.fwd_per_token_block(),
            r.bwd_per_token_block(), double(r.fwd.calls) / blocks, double(r.bwd.calls) / blocks,
            r.iter_ms, r.comm_ms, r.iter_ms - r.comm_ms, double(r.tokens) / (r.iter_ms / 1e3),
            double(r.peak_bytes) / 1e6, double(r.activation_bytes) / 1e6);
      }
      std::fflush(stdout);
    }
    if (leader && !o->json && results.size() >= 3) {
      const ModeResult &full = results[0], &vanilla = results[1], &btp = results[2];
      std::printf(
          "  forward volume vs full-rank TP: vanilla %.3fx, btp %.3fx | btp iteration speedup: "
          "%.2fx vs vanilla, %.2fx vs full-rank TP\n",
          vanilla.fwd_per_token_block() / full.fwd_per_token_block(),
          btp.fwd_per_token_block() / full.fwd_per_token_block(), vanilla.iter_ms / btp.iter_ms,
          full.iter_ms / btp.iter_ms);
      if (results.size() == 6)
        std::printf(
            "  grouping speedup: vanilla %.2fx, btp %.2fx | btp with RMSNorm's backward "
            "statistic all-reduced: %.3fx the time of taking it from the latent\n",
            std::pow(results[3].iter_ms / vanilla.iter_ms, grouping ? 1 : -1),
            std::pow(results[4].iter_ms / btp.iter_ms, grouping ? 1 : -1),
            results[5].iter_ms / btp.iter_ms);
    }
    return 0;
  };
}

}  // namespace bottle
