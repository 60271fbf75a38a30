// The whole model on a backend named on the command line (`cuda` by default; `reference` in
// every build, so that the harness runs everywhere) against the `cpu` backend: the loss and
// every parameter gradient of one forward and backward, for each bottleneck kind, in f32 and
// bf16; then 50 training steps (AdamW, clipping, the learning-rate schedule) whose losses must
// follow the cpu run's. Nothing reads tensor memory directly: weights, tokens and gradients
// cross with from_host / to_host, so the backend under test may keep them on a GPU.
//
//   test_model_backends [BACKEND] [gtest flags]   exit 77 (ctest: skipped) when BACKEND
//                                                 cannot run here, printing why
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_test_main.h"
#include "model/llama.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

std::string g_backend = "cuda";
BackendOptions g_options;  // "cuda:own": the own attention kernels (backend_test_main.h)

struct ModelCase {
  BottleneckKind kind;
  Precision precision;
};

std::string case_name(const ::testing::TestParamInfo<ModelCase>& info) {
  return fmt::format("{}_{}", bottleneck_kind_name(info.param.kind),
                     enum_name(info.param.precision));
}

ModelConfig small_model(BottleneckKind kind) {
  ModelConfig c;
  c.vocab_size = 96;
  c.hidden_size = 64;
  c.intermediate_size = 96;
  c.num_layers = 2;
  c.num_heads = 4;
  c.num_kv_heads = 2;
  c.max_seq_len = 64;
  c.bottleneck = kind;
  c.rank = 16;
  return c;
}

std::vector<int32_t> token_stream(int64_t n, int64_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> id(0, int32_t(vocab) - 1);
  std::vector<int32_t> s(static_cast<size_t>(n));
  for (int32_t& t : s) t = id(rng);
  return s;
}

std::vector<float> to_floats(Backend& be, Tensor t) {
  std::vector<float> v(size_t(t.numel()));
  be.to_host(v.data(), t);
  return v;
}

struct LossAndGrads {
  float loss = 0;
  std::vector<float> grads;
};

// One forward and backward of the same weights (same seed) and tokens on `be`.
LossAndGrads forward_backward(Backend& be, const ModelConfig& config, DType compute) {
  LlamaModel model(config, TensorParallel{&default_tp_layout(config.shape())}, 1, {}, false, be,
                   compute);
  model.init_weights(17);
  const int64_t batch = 2, seq = 24;
  model.allocate_activations(batch, seq);
  Arena arena(MemoryTag::workspace, be);
  Tensor tokens = arena.alloc({batch, seq}, DType::i32),
         targets = arena.alloc({batch, seq}, DType::i32);
  const auto stream = token_stream(batch * seq + 1, config.vocab_size, 5);
  be.from_host(tokens, stream.data());
  be.from_host(targets, stream.data() + 1);
  model.zero_grad(be);
  LossAndGrads r;
  r.loss = model.forward(be, tokens, targets);
  model.backward(be, tokens, targets);
  r.grads = to_floats(be, model.parameters().grads());
  return r;
}

class ModelBackends : public ::testing::TestWithParam<ModelCase> {
 protected:
  std::unique_ptr<Backend> target = make_backend(g_backend, g_options);
  std::unique_ptr<Backend> cpu = make_backend("cpu");
};

TEST_P(ModelBackends, LossAndEveryGradientMatchTheCpuBackend) {
  const ModelCase c = GetParam();
  const ModelConfig config = small_model(c.kind);
  const DType compute = compute_dtype(c.precision);
  const LossAndGrads want = forward_backward(*cpu, config, compute);
  const LossAndGrads got = forward_backward(*target, config, compute);
  // fp32: only the order of the sums differs. bf16: both round the same activations, but a
  // last-bit difference in one rounding moves later ones, and the bf16 epsilon is 2^-8.
  const bool bf16 = c.precision == Precision::bf16;
  EXPECT_NEAR(got.loss, want.loss, (bf16 ? 2e-3 : 2e-5) * std::abs(want.loss)) << g_backend;
  ASSERT_EQ(got.grads.size(), want.grads.size());
  double dot = 0, g2 = 0, w2 = 0, max_err = 0, max_ref = 0;
  for (size_t i = 0; i < want.grads.size(); ++i) {
    dot += double(got.grads[i]) * want.grads[i];
    g2 += double(got.grads[i]) * got.grads[i];
    w2 += double(want.grads[i]) * want.grads[i];
    max_err = std::max(max_err, double(std::abs(got.grads[i] - want.grads[i])));
    max_ref = std::max(max_ref, double(std::abs(want.grads[i])));
  }
  const double cosine = dot / std::sqrt(g2 * w2);
  EXPECT_GT(cosine, bf16 ? 0.999 : 0.999999) << g_backend;
  EXPECT_LT(max_err / max_ref, bf16 ? 5e-2 : 1e-4) << g_backend;
  std::printf("%s vs cpu, %s %s: loss %.7f vs %.7f, gradient cosine %.7f, max err %.2e of %.2e\n",
              g_backend.c_str(), bottleneck_kind_name(c.kind), enum_name(c.precision), got.loss,
              want.loss, cosine, max_err, max_ref);
}

// 50 steps of `bottle train`'s step on each backend from the same weights and batches.
std::vector<double> train_losses(Backend& be, const ModelConfig& model, Precision precision) {
  TrainConfig config;
  config.model = model;
  config.training.micro_batch_size = 2;
  config.training.seq_len = 24;
  config.training.precision = precision;
  config.optimizer.lr = 3e-3;
  config.lr_scheduler.warmup_steps = 5;
  config.training.steps = 50;
  config.parallel.tp_mode = &default_tp_layout(model.shape());
  TrainStep step(config, be, tensor_parallel_of(config, nullptr), nullptr, nullptr);
  step.model().init_weights(23);
  step.allocate_activations();
  std::vector<double> losses;
  for (int64_t s = 0; s < config.training.steps; ++s) {
    const auto stream = token_stream(2 * 24 + 1, model.vocab_size, uint32_t(100 + s % 7));
    be.from_host(step.inputs()[0], stream.data());
    be.from_host(step.targets()[0], stream.data() + 1);
    const int64_t waits = be.host_waits();
    losses.push_back(step.step(s).loss);
    // One wait a step, for its loss and norm; the first may also grow the scratch buffers.
    if (s > 0) {
      EXPECT_LE(be.host_waits() - waits, 1) << be.name() << ", step " << s + 1;
    }
  }
  return losses;
}

TEST_P(ModelBackends, FiftyTrainingStepsFollowTheCpuBackend) {
  const ModelCase c = GetParam();
  const ModelConfig config = small_model(c.kind);
  const auto want = train_losses(*cpu, config, c.precision);
  const auto got = train_losses(*target, config, c.precision);
  const bool bf16 = c.precision == Precision::bf16;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i)
    worst = std::max(worst, std::abs(got[i] - want[i]) / std::abs(want[i]));
  // Training amplifies the summation-order differences a little every step; the model must
  // still learn the same way (the batches repeat every 7 steps, so the loss falls).
  EXPECT_LT(worst, bf16 ? 3e-2 : 1e-3) << g_backend;
  EXPECT_LT(got.back(), got.front() - 0.5) << "the run on " << g_backend << " did not learn";
  std::printf(
      "%s vs cpu, %s %s, 50 steps: loss %.5f → %.5f (cpu %.5f → %.5f), worst relative "
      "difference %.2e\n",
      g_backend.c_str(), bottleneck_kind_name(c.kind), enum_name(c.precision), got.front(),
      got.back(), want.front(), want.back(), worst);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ModelBackends,
                         ::testing::Values(ModelCase{BottleneckKind::none, Precision::fp32},
                                           ModelCase{BottleneckKind::cola, Precision::fp32},
                                           ModelCase{BottleneckKind::lax, Precision::fp32},
                                           ModelCase{BottleneckKind::svd, Precision::fp32},
                                           ModelCase{BottleneckKind::none, Precision::bf16},
                                           ModelCase{BottleneckKind::cola, Precision::bf16},
                                           ModelCase{BottleneckKind::lax, Precision::bf16}),
                         case_name);

}  // namespace
}  // namespace bottle

int main(int argc, char** argv) {
  return bottle::testing::run_on_backend(argc, argv, bottle::g_backend, &bottle::g_options);
}
