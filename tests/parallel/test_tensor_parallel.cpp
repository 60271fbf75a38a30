// Tensor parallelism under mpirun (2 and 4 ranks, the TP group is the whole world): every
// mode and bottleneck kind against the same model on one rank, and the communicator's
// counters against docs/design.md §4's volumes. The online RMSNorm's accuracy has its own
// suite (test_online_rmsnorm.cpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <random>

#include "comm/communicator.h"
#include "model/llama.h"
#include "test_util.h"
#include "train/adamw.h"
#include "train/train_config.h"

namespace bottle {
namespace {

using testing::init_for_test;
using testing::tiny_config;

Communicator& world() { return world_communicator(); }

std::vector<int32_t> random_tokens(int64_t count, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(vocab));
  return tokens;
}

struct Case {
  BottleneckKind kind;
  const TpLayout* mode;
  int64_t kv_heads;
  bool tied;
  bool grouping;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}_kv{}{}{}", bottleneck_kind_name(c.kind), c.mode->name(), c.kv_heads,
                     c.tied ? "_tied" : "", c.grouping ? "" : "_nogroup");
}

// Shapes every TP degree up to 4 divides: V, d, d_ff, H, H_kv, and r (vanilla).
ModelConfig parity_config(const Case& c) {
  ModelConfig m = tiny_config(c.kind, c.kv_heads, c.tied);
  m.num_heads = 8;
  m.hidden_size = 64;
  m.intermediate_size = 96;
  m.num_layers = 3;  // LaX: two blocks with a crossing
  m.rank = 16;
  m.ranks[int(ProjectionId::k)] = c.kind == BottleneckKind::none ? 0 : 12;  // uneven ranks
  return m;
}

class TpParity : public ::testing::TestWithParam<Case> {};

// Max |a - b| over a parameter's slice, and max |b| of the whole parameter.
struct Diff {
  double err = 0, scale = 0;
};

Diff compare_slice(const ParamSpec& local_spec, const float* local, const float* whole,
                   int64_t whole_numel) {
  Diff d;
  for (int64_t j = 0; j < whole_numel; ++j)
    d.scale = std::max(d.scale, double(std::fabs(whole[j])));
  for (int64_t j = 0; j < local_spec.shape.numel(); ++j)
    d.err = std::max(d.err, double(std::fabs(local[j] - whole[local_spec.global_index(j)])));
  return d;
}

TEST_P(TpParity, LossAndEveryGradientMatchOneRank) {
  const Case c = GetParam();
  const ModelConfig config = parity_config(c);
  auto be = make_backend("cpu");
  const int64_t batch = 2, seq = 16, n = batch * seq;
  const auto tokens = random_tokens(n, config.vocab_size, 7);
  const auto targets = random_tokens(n, config.vocab_size, 8);
  Tensor tok{const_cast<int32_t*>(tokens.data()), {batch, seq}, DType::i32};
  Tensor tgt{const_cast<int32_t*>(targets.data()), {batch, seq}, DType::i32};

  LlamaModel serial(config, TensorParallel{c.mode, nullptr, c.grouping});
  init_for_test(serial, 11);
  serial.allocate_activations(batch, seq);
  serial.zero_grad(*be);
  const float serial_loss = serial.forward(*be, tok, tgt);
  serial.backward(*be, tok, tgt);

  LlamaModel tp(config, TensorParallel{c.mode, &world(), c.grouping});
  init_for_test(tp, 11);
  tp.allocate_activations(batch, seq);
  tp.zero_grad(*be);
  const float tp_loss = tp.forward(*be, tok, tgt);
  tp.backward(*be, tok, tgt);

  EXPECT_LE(std::fabs(tp_loss - serial_loss), 1e-5 * std::fabs(serial_loss))
      << tp_loss << " vs " << serial_loss;
  const ParameterStore& sp = serial.parameters();
  const ParameterStore& pp = tp.parameters();
  ASSERT_EQ(sp.specs().size(), pp.specs().size());
  for (size_t i = 0; i < pp.specs().size(); ++i) {
    const ParamSpec& spec = pp.specs()[i];
    const Param whole = sp.get(spec.name);
    ASSERT_EQ(spec.full_shape, whole.value.shape) << spec.name;
    const Diff w =
        compare_slice(spec, pp.at(i).value.f32(), whole.value.f32(), whole.value.numel());
    EXPECT_EQ(w.err, 0.0) << spec.name << ": the TP slice is not the one-rank weights' slice";
    const Diff g = compare_slice(spec, pp.at(i).grad.f32(), whole.grad.f32(), whole.grad.numel());
    EXPECT_LE(g.err, 1e-4 * g.scale) << spec.name << " (max |grad| " << g.scale << ")";
    EXPECT_GT(g.scale, 0.0) << spec.name << " has no gradient";
  }
  // Sharded gradients summed over ranks, replicated ones once: the one-rank norm.
  const double serial_norm = serial.grad_sum_squares(*be), tp_norm = tp.grad_sum_squares(*be);
  EXPECT_LE(std::fabs(tp_norm - serial_norm), 1e-5 * serial_norm);
}

// `steps` AdamW steps at lr 1e-3, clipped at global gradient norm 1, on a learnable stream
// (each token the previous one plus 1 or 2), from the seed-5 weights: the losses.
std::vector<float> train_steps(Backend& be, const ModelConfig& config, TensorParallel tp, int steps,
                               DType compute = DType::f32) {
  const int64_t batch = 2, seq = 16, n = batch * seq;
  LlamaModel model(config, tp, 1, {}, false, be, compute);
  model.init_weights(5);
  model.allocate_activations(batch, seq);
  AdamWConfig opt = OptimizerConfig{}.adamw();
  opt.lr = 1e-3f;
  AdamW adamw(model.parameters(), opt);
  std::vector<float> losses;
  for (int step = 0; step < steps; ++step) {
    std::vector<int32_t> tokens(size_t(n + 1));
    std::mt19937 rng(100 + step);
    tokens[0] = int32_t(rng() % uint32_t(config.vocab_size));
    for (size_t i = 1; i < tokens.size(); ++i)
      tokens[i] = int32_t((tokens[i - 1] + 1 + rng() % 2) % config.vocab_size);
    std::vector<int32_t> in(tokens.begin(), tokens.end() - 1),
        out(tokens.begin() + 1, tokens.end());
    Tensor tok{in.data(), {batch, seq}, DType::i32}, tgt{out.data(), {batch, seq}, DType::i32};
    model.zero_grad(be);
    losses.push_back(model.forward(be, tok, tgt));
    model.backward(be, tok, tgt);
    const double norm = std::sqrt(model.grad_sum_squares(be));
    // The step's control tensor (clip factor, apply) in host memory: the cpu backend's.
    std::vector<float> control{norm > 1.0 ? float(1.0 / norm) : 1.0f, 1.0f};
    adamw.step(be, model.parameters(), opt.lr, host_tensor(std::span(control)));
    adamw.count_step();
  }
  return losses;
}

// 20 AdamW steps with clipping on the global gradient norm: the same losses as one rank.
class TpTraining : public ::testing::TestWithParam<Case> {};

TEST_P(TpTraining, TwentyStepsMatchOneRank) {
  const Case c = GetParam();
  const ModelConfig config = parity_config(c);
  auto be = make_backend("cpu");
  const auto serial = train_steps(*be, config, TensorParallel{c.mode, nullptr, c.grouping}, 20),
             tp = train_steps(*be, config, TensorParallel{c.mode, &world(), c.grouping}, 20);
  double worst = 0;
  for (int step = 0; step < 20; ++step) {
    EXPECT_NEAR(tp[step], serial[step], 1e-4) << "step " << step;
    worst = std::max(worst, double(std::fabs(tp[step] - serial[step])));
  }
  if (world().rank() == 0)
    std::printf("%s: 20 steps, max |loss - one rank's| = %.2e\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), worst);
  EXPECT_LT(serial.back(), serial.front());  // it trains
}

std::vector<Case> parity_cases() {
  std::vector<Case> cases{{BottleneckKind::none, &tp_layout("full"), 8, false, true},
                          {BottleneckKind::none, &tp_layout("full"), 4, true, true}};
  for (auto kind : {BottleneckKind::svd, BottleneckKind::cola, BottleneckKind::lax})
    for (const TpLayout* mode : {&tp_layout("vanilla"), &tp_layout("btp")}) {
      cases.push_back({kind, mode, 8, false, true});
      cases.push_back({kind, mode, 4, true, true});    // GQA, tied embeddings
      cases.push_back({kind, mode, 8, false, false});  // grouping off
    }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, TpParity, ::testing::ValuesIn(parity_cases()), case_name);

std::vector<Case> training_cases() {
  std::vector<Case> cases;
  for (const Case& c : parity_cases())
    if (c.grouping && !c.tied) cases.push_back(c);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, TpTraining, ::testing::ValuesIn(training_cases()), case_name);

// Mixed precision (bf16 activations and compute weights, fp32 masters): 10 AdamW steps under
// TP equal one process in bf16 within 1e-2 relative loss; every collective moves the
// same elements as in fp32 and half the bytes (btp's fp32 RMSNorm statistics aside).
class TpTrainingBf16 : public ::testing::TestWithParam<Case> {};

TEST_P(TpTrainingBf16, TenStepsMatchOneRankAndHalveTheBytes) {
  const Case c = GetParam();
  const ModelConfig config = parity_config(c);
  auto be = make_backend("cpu");
  const TensorParallel one{c.mode, nullptr, c.grouping}, tp{c.mode, &world(), c.grouping};
  const auto serial = train_steps(*be, config, one, 10, DType::bf16);
  world().stats().reset();
  const auto losses = train_steps(*be, config, tp, 10, DType::bf16);
  const CommCounter bf16_volume = world().stats().total();
  world().stats().reset();
  train_steps(*be, config, tp, 10, DType::f32);
  const CommCounter fp32_volume = world().stats().total();
  double worst = 0;
  for (int step = 0; step < 10; ++step) {
    const double rel = std::fabs(losses[step] - serial[step]) / std::fabs(serial[step]);
    EXPECT_LE(rel, 1e-2) << "step " << step << ": " << losses[step] << " vs " << serial[step];
    worst = std::max(worst, rel);
  }
  EXPECT_LT(serial.back(), serial.front());  // it trains
  EXPECT_EQ(bf16_volume.elements, fp32_volume.elements);
  EXPECT_EQ(fp32_volume.bytes, 4 * fp32_volume.elements);
  const double byte_ratio = double(bf16_volume.bytes) / double(fp32_volume.bytes);
  EXPECT_LE(byte_ratio, 0.52);
  if (world().rank() == 0)
    std::printf(
        "%s: 10 bf16 steps, max relative |loss - one rank's| = %.2e; TP bytes bf16/fp32 = "
        "%.3f\n",
        ::testing::UnitTest::GetInstance()->current_test_info()->name(), worst, byte_ratio);
}

std::vector<Case> bf16_cases() {
  std::vector<Case> cases{{BottleneckKind::none, &tp_layout("full"), 8, false, true}};
  for (auto kind : {BottleneckKind::cola, BottleneckKind::lax})
    for (const TpLayout* mode : {&tp_layout("vanilla"), &tp_layout("btp")})
      cases.push_back({kind, mode, 4, false, true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, TpTrainingBf16, ::testing::ValuesIn(bf16_cases()), case_name);

// --- The communicator's counters against docs/design.md §4's per-block volumes.
struct CountCase {
  BottleneckKind kind;
  const TpLayout* mode;
  bool grouping;
  NormStatistic statistic = NormStatistic::from_latent;
};

class TpVolumes : public ::testing::TestWithParam<CountCase> {};

TEST_P(TpVolumes, PerBlockAndPassMatchTheFormulas) {
  const CountCase c = GetParam();
  ModelConfig config = parity_config({c.kind, c.mode, 8, false, c.grouping});
  config.ranks = {};  // one rank r for all seven projections
  const int64_t L = config.num_layers, d = config.hidden_size, dff = config.intermediate_size,
                r = config.rank;
  auto be = make_backend("cpu");
  const int64_t batch = 2, seq = 16, n = batch * seq;
  const auto tokens = random_tokens(n, config.vocab_size, 1);
  Tensor tok{const_cast<int32_t*>(tokens.data()), {batch, seq}, DType::i32};
  TensorParallel tp{c.mode, &world(), c.grouping, c.statistic};
  LlamaModel model(config, tp);
  model.init_weights(1);
  model.allocate_activations(batch, seq);
  const std::string prefix = c.mode->name();
  CommStats& stats = world().stats();
  stats.reset();
  model.forward(*be, tok, tok);
  const CommCounter fwd = stats.with_prefix(prefix + ".fwd.");
  const CommCounter lax_fwd = stats.with_prefix(prefix + ".fwd.lax_gather");
  stats.reset();
  model.backward(*be, tok, tok);
  const CommCounter bwd = stats.with_prefix(prefix + ".bwd.");
  const CommCounter lax_bwd = stats.with_prefix(prefix + ".bwd.lax_gather");
  // Per block, per token (MHA).
  int64_t fwd_elems = 0, bwd_elems = 0, fwd_calls = 0, bwd_calls = 0, lax_extra = 0;
  if (prefix == "full") {
    fwd_elems = bwd_elems = 2 * d;
    fwd_calls = bwd_calls = 2;
  } else if (prefix == "vanilla") {
    fwd_elems = 5 * d + 2 * dff;
    bwd_elems = c.grouping ? 3 * d + dff : 6 * d + dff;
    fwd_calls = bwd_calls = c.grouping ? 4 : 7;
    // LaX: each projection all-gathers its latent slice, each way.
    if (c.kind == BottleneckKind::lax) lax_extra = 7 * r;
  } else if (prefix == "btp") {
    fwd_elems = 7 * r + 2;  // + the two RMSNorm statistics, in the same collectives
    bwd_elems = 7 * r + (c.statistic == NormStatistic::all_reduce ? 2 : 0);
    fwd_calls = bwd_calls = c.grouping ? 4 : 7;
    if (c.statistic == NormStatistic::all_reduce) bwd_calls += 2;
  } else {
    FAIL() << "no volume formula for mode " << prefix;
  }
  EXPECT_EQ(fwd.elements, L * n * (fwd_elems + lax_extra));
  EXPECT_EQ(bwd.elements, L * n * (bwd_elems + lax_extra));
  EXPECT_EQ(lax_fwd.elements, L * n * lax_extra);
  EXPECT_EQ(lax_bwd.elements, L * n * lax_extra);
  const int64_t lax_calls = lax_extra ? 7 : 0;
  EXPECT_EQ(fwd.calls, L * (fwd_calls + lax_calls));
  EXPECT_EQ(bwd.calls, L * (bwd_calls + lax_calls));
}

std::vector<CountCase> count_cases() {
  std::vector<CountCase> cases{{BottleneckKind::none, &tp_layout("full"), true}};
  for (auto kind : {BottleneckKind::svd, BottleneckKind::cola, BottleneckKind::lax})
    for (const TpLayout* mode : {&tp_layout("vanilla"), &tp_layout("btp")})
      for (bool grouping : {true, false}) cases.push_back({kind, mode, grouping});
  cases.push_back({BottleneckKind::cola, &tp_layout("btp"), true, NormStatistic::all_reduce});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, TpVolumes, ::testing::ValuesIn(count_cases()),
                         [](const auto& info) {
                           const CountCase& c = info.param;
                           return fmt::format(
                               "{}_{}{}{}", bottleneck_kind_name(c.kind), c.mode->name(),
                               c.grouping ? "" : "_nogroup",
                               c.statistic == NormStatistic::all_reduce ? "_stat_allreduce" : "");
                         });

// --- TP overlap (parallel.tp_overlap): each micro-batch's blocks as two halves of its
// sequences, one half's collectives travelling while the other computes.
struct OverlapCase {
  BottleneckKind kind;
  const TpLayout* mode;
  bool grouping;
  Recompute policy;
};

class TpOverlapParity : public ::testing::TestWithParam<OverlapCase> {};

struct OverlapRun {
  float loss = 0;
  std::vector<std::vector<float>> grads;  // per parameter
  std::map<std::string, CommCounter, std::less<>> sites;
  size_t activation_bytes = 0;
};

// One forward and backward of `tok` on `tp`: the loss, every parameter gradient, the
// collectives per site and the activation memory.
OverlapRun run_once(Backend& be, const ModelConfig& config, const TensorParallel& tp,
                    Recompute policy, Tensor tok, Tensor tgt, DType compute = DType::f32) {
  LlamaModel model(config, tp, {}, {}, false, host_backend(), compute);
  init_for_test(model, 11);
  model.parameters().refresh_compute(be);
  model.allocate_activations(tok.shape[0], tok.shape[1], 1, policy);
  model.zero_grad(be);
  world().stats().reset();
  OverlapRun r;
  r.loss = model.forward(be, tok, tgt);
  model.backward(be, tok, tgt);
  r.sites = world().stats().by_site();
  r.activation_bytes = model.activation_bytes();
  const ParameterStore& params = model.parameters();
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const Tensor g = params.at(i).grad;
    r.grads.emplace_back(g.f32(), g.f32() + g.numel());
  }
  return r;
}

OverlapRun run_once(Backend& be, const ModelConfig& config, const OverlapCase& c, bool overlap,
                    Tensor tok, Tensor tgt) {
  return run_once(
      be, config,
      TensorParallel{
          .layout = c.mode, .comm = &world(), .grouping = c.grouping, .overlap = overlap},
      c.policy, tok, tgt);
}

// Against the same TP group run serially: the same loss bit for bit (a half's activations are
// the serial pass's rows: GEMM rows do not depend on M, norms and attention work row by row and
// sequence by sequence, and an all-reduce adds each element alike whatever the buffer's
// length), every parameter gradient within fp32 rounding of a sum over rows taken in two
// parts, each block's call sites called twice as often with the same elements, and the same
// activation memory but alignment.
TEST_P(TpOverlapParity, HalvesGiveTheSerialLossAndGradients) {
  const OverlapCase c = GetParam();
  const ModelConfig config = parity_config({c.kind, c.mode, 4, false, c.grouping});
  auto be = make_backend("cpu");
  const int64_t batch = 4, seq = 16, n = batch * seq;
  const auto tokens = random_tokens(n, config.vocab_size, 7);
  const auto targets = random_tokens(n, config.vocab_size, 8);
  Tensor tok{const_cast<int32_t*>(tokens.data()), {batch, seq}, DType::i32};
  Tensor tgt{const_cast<int32_t*>(targets.data()), {batch, seq}, DType::i32};
  const OverlapRun serial = run_once(*be, config, c, false, tok, tgt);
  const OverlapRun halves = run_once(*be, config, c, true, tok, tgt);

  EXPECT_EQ(halves.loss, serial.loss);
  ASSERT_EQ(halves.grads.size(), serial.grads.size());
  double worst = 0;
  for (size_t i = 0; i < serial.grads.size(); ++i) {
    double err = 0, scale = 0;
    for (size_t j = 0; j < serial.grads[i].size(); ++j) {
      err = std::max(err, double(std::fabs(halves.grads[i][j] - serial.grads[i][j])));
      scale = std::max(scale, double(std::fabs(serial.grads[i][j])));
    }
    EXPECT_LE(err, 1e-5 * scale) << "parameter " << i;
    if (scale > 0) worst = std::max(worst, err / scale);
  }
  const std::string block_sites = std::string(c.mode->name()) + ".";
  for (const auto& [site, counter] : serial.sites) {
    ASSERT_TRUE(halves.sites.contains(site)) << site;
    const CommCounter& h = halves.sites.find(site)->second;
    const bool in_block = site.find(block_sites) != std::string::npos;
    EXPECT_EQ(h.calls, (in_block ? 2 : 1) * counter.calls) << site;
    EXPECT_EQ(h.elements, counter.elements) << site;
  }
  EXPECT_EQ(halves.sites.size(), serial.sites.size());
  // Twice the buffers at half the rows: the same bytes but the arena's alignment of each,
  // a few percent at these small widths.
  EXPECT_LE(double(halves.activation_bytes), 1.05 * double(serial.activation_bytes));
  if (world().rank() == 0)
    std::printf("%s: loss equal, max |Δgrad| / max |grad| = %.2e, activations %zu vs %zu B\n",
                ::testing::UnitTest::GetInstance()->current_test_info()->name(), worst,
                halves.activation_bytes, serial.activation_bytes);
}

std::vector<OverlapCase> overlap_cases() {
  std::vector<OverlapCase> cases{
      {BottleneckKind::none, &tp_layout("full"), true, Recompute::none},
      {BottleneckKind::none, &tp_layout("full"), true, Recompute::block}};
  for (auto kind : {BottleneckKind::svd, BottleneckKind::cola, BottleneckKind::lax})
    for (const TpLayout* mode : {&tp_layout("vanilla"), &tp_layout("btp")})
      cases.push_back({kind, mode, true, Recompute::none});
  cases.push_back({BottleneckKind::cola, &tp_layout("vanilla"), false, Recompute::none});
  cases.push_back({BottleneckKind::cola, &tp_layout("btp"), false, Recompute::none});
  cases.push_back({BottleneckKind::lax, &tp_layout("vanilla"), true, Recompute::block});
  cases.push_back({BottleneckKind::cola, &tp_layout("btp"), true, Recompute::block});
  cases.push_back({BottleneckKind::cola, &tp_layout("btp"), true, Recompute::lowrank});
  cases.push_back({BottleneckKind::lax, &tp_layout("btp"), true, Recompute::lowrank});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, TpOverlapParity, ::testing::ValuesIn(overlap_cases()),
                         [](const auto& info) {
                           const OverlapCase& c = info.param;
                           return fmt::format("{}_{}_{}{}", bottleneck_kind_name(c.kind),
                                              c.mode->name(), recompute_name(c.policy),
                                              c.grouping ? "" : "_nogroup");
                         });

// --- The TP backward's order (parallel.tp_backward): each input gradient's all-reduce started
// before the layer's weight gradient and waited for after it (async, Megatron's order), against
// after it (serial, the order before). The weight gradient reads neither the input gradient nor
// what the all-reduce writes, and recursive doubling adds alike on any thread: the same bits.
struct OrderCase {
  BottleneckKind kind;
  const TpLayout* mode;
  bool grouping;
  Recompute policy;
  DType compute;
};

OverlapRun run_order(Backend& be, const ModelConfig& config, const OrderCase& c, TpBackward order,
                     Tensor tok, Tensor tgt) {
  return run_once(
      be, config,
      TensorParallel{.layout = c.mode, .comm = &world(), .grouping = c.grouping, .backward = order},
      c.policy, tok, tgt, c.compute);
}

class TpBackwardOrder : public ::testing::TestWithParam<OrderCase> {};

TEST_P(TpBackwardOrder, AsyncGivesTheSerialBits) {
  const OrderCase c = GetParam();
  const ModelConfig config = parity_config({c.kind, c.mode, 4, false, c.grouping});
  auto be = make_backend("cpu");
  const int64_t batch = 2, seq = 16, n = batch * seq;
  const auto tokens = random_tokens(n, config.vocab_size, 7);
  const auto targets = random_tokens(n, config.vocab_size, 8);
  Tensor tok{const_cast<int32_t*>(tokens.data()), {batch, seq}, DType::i32};
  Tensor tgt{const_cast<int32_t*>(targets.data()), {batch, seq}, DType::i32};
  const OverlapRun serial = run_order(*be, config, c, TpBackward::serial, tok, tgt);
  const OverlapRun async = run_order(*be, config, c, TpBackward::async, tok, tgt);
  EXPECT_EQ(async.loss, serial.loss);
  ASSERT_EQ(async.grads.size(), serial.grads.size());
  for (size_t i = 0; i < serial.grads.size(); ++i) {
    ASSERT_EQ(async.grads[i].size(), serial.grads[i].size());
    size_t differing = 0;
    for (size_t j = 0; j < serial.grads[i].size(); ++j)
      differing += std::memcmp(&async.grads[i][j], &serial.grads[i][j], sizeof(float)) != 0;
    EXPECT_EQ(differing, 0u) << "parameter " << i << " (" << serial.grads[i].size() << " elements)";
  }
  // The same collectives: every site, its calls and its elements.
  ASSERT_EQ(async.sites.size(), serial.sites.size());
  for (const auto& [site, counter] : serial.sites) {
    ASSERT_TRUE(async.sites.contains(site)) << site;
    EXPECT_EQ(async.sites.find(site)->second.calls, counter.calls) << site;
    EXPECT_EQ(async.sites.find(site)->second.elements, counter.elements) << site;
  }
}

std::vector<OrderCase> order_cases() {
  const Recompute none = Recompute::none;
  std::vector<OrderCase> cases{
      {BottleneckKind::none, &tp_layout("full"), true, none, DType::f32},
      {BottleneckKind::none, &tp_layout("full"), false, none, DType::f32},
      {BottleneckKind::none, &tp_layout("full"), true, Recompute::block, DType::bf16}};
  for (auto kind : {BottleneckKind::svd, BottleneckKind::cola, BottleneckKind::lax})
    for (const TpLayout* mode : {&tp_layout("vanilla"), &tp_layout("btp")})
      for (bool grouping : {true, false}) cases.push_back({kind, mode, grouping, none, DType::f32});
  cases.push_back({BottleneckKind::cola, &tp_layout("vanilla"), true, none, DType::bf16});
  cases.push_back({BottleneckKind::lax, &tp_layout("btp"), true, none, DType::bf16});
  cases.push_back({BottleneckKind::lax, &tp_layout("vanilla"), true, Recompute::block, DType::f32});
  cases.push_back({BottleneckKind::cola, &tp_layout("btp"), true, Recompute::lowrank, DType::bf16});
  cases.push_back({BottleneckKind::lax, &tp_layout("btp"), false, Recompute::lowrank, DType::f32});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Modes, TpBackwardOrder, ::testing::ValuesIn(order_cases()),
                         [](const auto& info) {
                           const OrderCase& c = info.param;
                           return fmt::format("{}_{}_{}{}_{}", bottleneck_kind_name(c.kind),
                                              c.mode->name(), recompute_name(c.policy),
                                              c.grouping ? "" : "_nogroup", dtype_name(c.compute));
                         });

}  // namespace
}  // namespace bottle
