// Activation recomputation under mpirun (the TP group is the whole world) and on one rank:
// gradients bit-identical to keeping everything, for every mode and policy; the collectives
// counted while recomputing (none under btp + lowrank, the block's own again under block);
// each policy's activation footprint; and the reserve-only plan against the real footprint.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "comm/communicator.h"
#include "model/llama.h"
#include "test_util.h"
#include "train/train_config.h"

namespace bottle {
namespace {

using testing::init_for_test;
using testing::tiny_config;

Communicator& world() { return world_communicator(); }

struct Case {
  BottleneckKind kind;
  const TpLayout* mode;
  Recompute policy;
  bool grouping = true;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  const Case& c = info.param;
  return fmt::format("{}_{}_{}{}", bottleneck_kind_name(c.kind), c.mode->name(),
                     recompute_name(c.policy), c.grouping ? "" : "_nogroup");
}

ModelConfig config_for(BottleneckKind kind) {
  ModelConfig m = tiny_config(kind, 4, false);
  m.num_heads = 4;
  m.hidden_size = 32;
  m.intermediate_size = 64;
  m.num_layers = 3;  // LaX: two blocks with a crossing
  m.rank = 8;
  m.ranks[int(ProjectionId::k)] = kind == BottleneckKind::none ? 0 : 6;  // uneven ranks
  return m;
}

struct Step {
  float loss = 0;
  std::vector<float> grads;
  CommStats stats;
  size_t activation_bytes = 0;
};

// One forward and backward of the same batch; comm null: one rank.
Step run(const Case& c, Recompute policy, Communicator* comm) {
  const ModelConfig config = config_for(c.kind);
  auto be = make_backend("cpu");
  const int64_t batch = 2, seq = 16, n = batch * seq;
  std::mt19937 rng(3);
  std::vector<int32_t> tokens(size_t(2 * n));
  for (auto& t : tokens) t = int32_t(rng() % uint32_t(config.vocab_size));
  Tensor tok{tokens.data(), {batch, seq}, DType::i32},
      tgt{tokens.data() + n, {batch, seq}, DType::i32};
  LlamaModel model(config, TensorParallel{c.mode, comm, c.grouping});
  init_for_test(model, 17);
  model.allocate_activations(batch, seq, 1, policy);
  model.zero_grad(*be);
  if (comm) comm->stats().reset();
  Step s;
  s.loss = model.forward(*be, tok, tgt);
  model.backward(*be, tok, tgt);
  if (comm) s.stats = comm->stats();
  const Tensor g = model.parameters().grads();
  s.grads.assign(g.f32(), g.f32() + g.numel());
  s.activation_bytes = model.activation_bytes();
  return s;
}

class Recomputation : public ::testing::TestWithParam<Case> {};

TEST_P(Recomputation, GradientsAreBitIdenticalToKeepingEverything) {
  const Case c = GetParam();
  for (Communicator* comm : {static_cast<Communicator*>(nullptr), &world()}) {
    SCOPED_TRACE(comm ? "tp = world" : "one rank");
    const Step kept = run(c, Recompute::none, comm);
    const Step recomputed = run(c, c.policy, comm);
    EXPECT_EQ(std::memcmp(&kept.loss, &recomputed.loss, sizeof(float)), 0);
    ASSERT_EQ(kept.grads.size(), recomputed.grads.size());
    size_t differing = 0;
    for (size_t i = 0; i < kept.grads.size(); ++i)
      differing += std::memcmp(&kept.grads[i], &recomputed.grads[i], sizeof(float)) != 0;
    EXPECT_EQ(differing, 0u) << "of " << kept.grads.size() << " gradient elements differ";
    EXPECT_LT(recomputed.activation_bytes, kept.activation_bytes);
  }
}

TEST_P(Recomputation, CountsTheCollectivesItReRuns) {
  const Case c = GetParam();
  const Step s = run(c, c.policy, &world());
  const std::string mode = c.mode->name();
  const CommCounter forward = s.stats.with_prefix(mode + ".fwd.");
  const CommCounter again = s.stats.with_prefix(kRecomputePhase);
  const CommCounter again_forward = s.stats.with_prefix(kRecomputePhase + mode + ".fwd.");
  ASSERT_GT(forward.calls, 0);
  if (c.policy == Recompute::lowrank) {
    EXPECT_EQ(again.calls, 0) << "lowrank recomputation issued a collective";
  } else {
    // The block's forward collectives once more, and nothing else.
    EXPECT_EQ(again_forward.calls, forward.calls);
    EXPECT_EQ(again_forward.elements, forward.elements);
    EXPECT_EQ(again.calls, again_forward.calls);
  }
}

std::vector<Case> cases() {
  using B = BottleneckKind;
  std::vector<Case> all{{B::none, &tp_layout("full"), Recompute::block}};
  for (B kind : {B::svd, B::cola, B::lax}) {
    all.push_back({kind, &tp_layout("vanilla"), Recompute::block});
    all.push_back({kind, &tp_layout("btp"), Recompute::block});
    all.push_back({kind, &tp_layout("btp"), Recompute::lowrank});
  }
  all.push_back({B::cola, &tp_layout("vanilla"), Recompute::block, false});
  all.push_back({B::cola, &tp_layout("btp"), Recompute::lowrank, false});
  return all;
}

INSTANTIATE_TEST_SUITE_P(Policies, Recomputation, ::testing::ValuesIn(cases()), case_name);

// lowrank keeps less than none and more than block, under btp at this TP degree.
TEST(RecomputeMemory, LowrankKeepsBetweenBlockAndEverything) {
  const Case c{BottleneckKind::cola, &tp_layout("btp"), Recompute::lowrank};
  const size_t none = run(c, Recompute::none, &world()).activation_bytes;
  const size_t lowrank = run(c, Recompute::lowrank, &world()).activation_bytes;
  const size_t block = run(c, Recompute::block, &world()).activation_bytes;
  EXPECT_LT(block, lowrank);
  EXPECT_LT(lowrank, none);
}

TEST(RecomputeMemory, RefusesPoliciesThatDoNotFit) {
  const ModelConfig cola = config_for(BottleneckKind::cola);
  LlamaModel vanilla(cola, TensorParallel{&tp_layout("vanilla"), &world()});
  EXPECT_THROW(
      {
        try {
          vanilla.allocate_activations(1, 8, 1, Recompute::lowrank);
        } catch (const SettingError& e) {
          // The model names the policy as wrong; train/ names it by its key.
          EXPECT_EQ(e.setting(), Setting::recompute);
          const std::string message = describe_setting_error(e);
          EXPECT_NE(message.find("training.recompute = \"lowrank\" needs "
                                 "parallel.tp_mode = \"btp\""),
                    std::string::npos)
              << message;
          throw;
        }
      },
      Error);
  LlamaModel full(config_for(BottleneckKind::none), TensorParallel{&tp_layout("full"), &world()});
  EXPECT_THROW(full.allocate_activations(1, 8, 1, Recompute::lowrank), Error);
}

// A reserve-only model lays out exactly the buffers a real one allocates, in fp32 and in
// bf16; bf16 holds at most 0.55x fp32's activations and buffers (the fp32 statistics and
// the padding of small buffers are what is above one half).
TEST(MemoryPlan, ReserveOnlyMatchesTheRealFootprint) {
  for (Recompute policy : {Recompute::none, Recompute::block, Recompute::lowrank})
    for (BottleneckKind kind : {BottleneckKind::cola, BottleneckKind::lax}) {
      size_t act_and_buffers[2] = {};
      for (DType compute : {DType::f32, DType::bf16}) {
        const ModelConfig config = config_for(kind);
        const TensorParallel tp{&tp_layout("btp"), &world()};
        LlamaModel plan(config, tp, 1, {}, true, host_backend(), compute);
        plan.allocate_activations(2, 16, 2, policy);
        const size_t live_before = MemoryStats::global().live_total();
        LlamaModel real(config, tp, 1, {}, false, host_backend(), compute);
        real.allocate_activations(2, 16, 2, policy);
        const MemoryBreakdown planned = plan.memory(), held = real.memory();
        EXPECT_EQ(planned.bytes, held.bytes)
            << recompute_name(policy) << " " << dtype_name(compute);
        EXPECT_EQ(MemoryStats::global().live_total() - live_before, held.total());
        act_and_buffers[compute == DType::bf16] =
            held[MemoryTag::activations] + held[MemoryTag::comm];
      }
      EXPECT_LE(double(act_and_buffers[1]), 0.55 * double(act_and_buffers[0]))
          << recompute_name(policy);
    }
}

}  // namespace
}  // namespace bottle
