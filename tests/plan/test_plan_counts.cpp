// bottle plan's dry run against the step it stands for, under mpirun -np 2: the same
// configuration run for real (the cpu backend wrapped in the profiling backend, the world as
// the TP or the pipeline group) and dry (the counting backend and counting communicators):
// the same matrix products shape for shape (how many of them run as one batched GEMM depends
// on where the allocator put their operands: gemm_grouped batches those it finds evenly spaced,
// which differs from rank to rank even in the real run), the same attention calls, and the same
// collectives site for site — calls, elements and bytes, recomputation's included — for every TP
// mode, recompute policy and a pipeline; and the dry run's memory equals the memory planner's.
#include <gtest/gtest.h>

#include <cstdio>
#include <map>
#include <random>
#include <tuple>

#include "comm/communicator.h"
#include "backend/profiling_backend.h"
#include "parallel/recompute.h"
#include "plan/dry_run.h"
#include "train/memory_plan.h"
#include "train/train_step.h"

namespace bottle {
namespace {

Communicator& world() { return world_communicator(); }

struct Case {
  const char* bottleneck;
  const char* mode;
  const char* recompute;
  int tp, pp;
  const char* precision = "fp32";
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}_{}_tp{}_pp{}_{}", c.bottleneck, c.mode, c.recompute, c.tp, c.pp,
                     c.precision);
}

TrainConfig config_of(const Case& c) {
  return parse_train_config_string(
      fmt::format(R"([model]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_layers = 4
num_heads = 4
num_kv_heads = 2
bottleneck = "{}"
rank = 8
max_seq_len = 16

[training]
micro_batch_size = 2
seq_len = 16
grad_accum_steps = 2
recompute = "{}"
precision = "{}"

[parallel]
tp = {}
pp = {}
tp_mode = "{}"
)",
                  c.bottleneck, c.recompute, c.precision, c.tp, c.pp, c.mode),
      "counts test");
}

// (m, n, k) → products (calls × batch), from the profiling backend's keys
// "gemm MxNxK TT[ xB][ bf16]".
using Shape = std::tuple<int64_t, int64_t, int64_t>;
std::map<Shape, int64_t> profiled_gemms(ProfilingBackend& be, double& flops) {
  std::map<Shape, int64_t> out;
  flops = 0;
  for (const auto& [key, t] : be.times()) {
    long long m = 0, n = 0, k = 0, batch = 1;
    char ta = 0, tb = 0;
    if (std::sscanf(key.c_str(), "gemm %lldx%lldx%lld %c%c x%lld", &m, &n, &k, &ta, &tb, &batch) <
        5)
      continue;
    out[Shape{m, n, k}] += t.calls * batch;
    flops += t.flops;
  }
  return out;
}

class DryRun : public ::testing::TestWithParam<Case> {};

TEST_P(DryRun, CountsWhatTheStepIssues) {
  const Case c = GetParam();
  const TrainConfig config = config_of(c);
  const int stage = c.pp > 1 ? world().rank() : 0;
  ASSERT_EQ(c.tp * c.pp, world().size());

  // The real step.
  ProfilingBackend be(make_backend("cpu"));
  Communicator* tp = c.tp > 1 ? &world() : nullptr;
  Communicator* pp = c.pp > 1 ? &world() : nullptr;
  TrainStep step(config, be, tensor_parallel_of(config, tp), pp, nullptr);
  step.model().init_weights(1);
  step.allocate_activations();
  std::mt19937 rng(7);
  for (const std::vector<Tensor>* batch : {&step.inputs(), &step.targets()})
    for (const Tensor& t : *batch) {
      std::vector<int32_t> ids(size_t(t.numel()));
      for (int32_t& id : ids) id = int32_t(rng() % 64);
      be.from_host(t, ids.data());
    }
  world().stats().reset();
  be.reset();
  step.step(0);
  const CommStats real = world().stats();

  MemoryBreakdown laid_out;
  const StageCounts dry = dry_run_step(config, stage, &laid_out);

  // GEMMs, shape for shape.
  double real_flops = 0;
  const std::map<Shape, int64_t> real_gemms = profiled_gemms(be, real_flops);
  std::map<Shape, int64_t> dry_gemms;
  double dry_flops = 0;
  int64_t dry_attention = 0;
  for (const auto& [phase, ops] : dry.ops) {
    for (const auto& [shape, calls] : ops.gemms)
      dry_gemms[Shape{shape.m, shape.n, shape.k}] += calls * shape.batch;
    dry_flops += ops.gemm_flops();
    for (const char* k : {"attention_forward", "attention_backward"})
      if (const auto it = ops.kernels.find(k); it != ops.kernels.end())
        dry_attention += it->second.calls;
  }
  EXPECT_EQ(dry_gemms, real_gemms);
  EXPECT_DOUBLE_EQ(dry_flops, real_flops);
  EXPECT_GT(real_flops, 0);
  int64_t real_attention = 0;
  for (const char* k : {"attention_forward", "attention_backward"})
    if (const auto it = be.times().find(k); it != be.times().end())
      real_attention += it->second.calls;
  EXPECT_EQ(dry_attention, real_attention);
  EXPECT_EQ(dry.ops.count(kRecomputePhase) > 0, std::string(c.recompute) != "none");

  // Collectives, site for site: the world was the TP group or the pipeline's.
  if (c.tp > 1) {
    const auto counted = calls_by_site(dry.calls.at("tp"));
    ASSERT_EQ(counted.size(), real.by_site().size());
    for (const auto& [site, r] : real.by_site()) {
      SCOPED_TRACE(site);
      const auto it = counted.find(site);
      ASSERT_NE(it, counted.end()) << "the dry run did not issue it";
      EXPECT_EQ(it->second.calls, r.calls);
      EXPECT_EQ(it->second.elements, r.elements);
      EXPECT_EQ(it->second.bytes, r.bytes);
    }
    EXPECT_GT(real.with_prefix(std::string(c.mode) + ".fwd.").elements, 0);
  } else {
    // The pipeline's sends and receives, and its reductions, by kind.
    std::map<std::pair<Collective, int64_t>, int64_t> real_calls, dry_calls;
    for (Collective k : {Collective::send, Collective::recv, Collective::all_reduce}) {
      real_calls[{k, real.by_kind(k).elements}] = real.by_kind(k).calls;
      int64_t calls = 0, elements = 0;
      for (const auto& [call, n] : dry.calls.at("pp"))
        if (call.kind == k) calls += n, elements += n * call.elements;
      dry_calls[{k, elements}] = calls;
    }
    EXPECT_EQ(dry_calls, real_calls);
    EXPECT_GT(real.by_kind(Collective::send).calls, 0);
  }

  // Memory: the dry run's own step laid out what the planner plans.
  for (MemoryTag tag : {MemoryTag::weights, MemoryTag::gradients, MemoryTag::activations,
                        MemoryTag::comm, MemoryTag::optimizer}) {
    SCOPED_TRACE(memory_tag_name(tag));
    EXPECT_EQ(laid_out[tag], dry.memory[tag]);
  }
  EXPECT_GT(dry.memory[MemoryTag::activations], 0u);
}

std::vector<Case> cases() {
  return {
      {"none", "full", "none", 2, 1},          {"none", "full", "block", 2, 1},
      {"cola", "vanilla", "none", 2, 1},       {"cola", "vanilla", "block", 2, 1},
      {"cola", "btp", "none", 2, 1},           {"cola", "btp", "lowrank", 2, 1},
      {"lax", "btp", "block", 2, 1},           {"svd", "btp", "none", 2, 1, "bf16"},
      {"lax", "vanilla", "none", 2, 1},        {"cola", "btp", "none", 1, 2},
      {"none", "full", "block", 1, 2, "bf16"},
  };
}

INSTANTIATE_TEST_SUITE_P(Layouts, DryRun, ::testing::ValuesIn(cases()), case_name);

}  // namespace
}  // namespace bottle
