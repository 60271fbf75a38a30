// Whole-model parity with PyTorch: the same checkpoint and tokens through bottle and through
// tools/torch_reference.py (float64), then loss, logits and every parameter gradient
// compared. Fails — never skips — when /usr/bin/python3 or torch is missing.
#include <cmath>

#include "io/safetensors.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

struct ParityCase {
  BottleneckKind kind;
  int64_t kv_heads;
  bool tied;
  bool uneven_ranks = false;  // a different rank in every projection
};

std::string case_name(const ::testing::TestParamInfo<ParityCase>& info) {
  const ParityCase& c = info.param;
  return fmt::format("{}_{}_{}{}", bottleneck_kind_name(c.kind), c.kv_heads == 4 ? "MHA" : "GQA",
                     c.tied ? "tied" : "untied", c.uneven_ranks ? "_uneven_ranks" : "");
}

std::vector<float> read_all(const SafeTensorsReader& r, const std::string& name) {
  std::vector<float> v(size_t(r.entry(name).numel()));
  r.read_f32(name, v);
  return v;
}

// max |a − b| over max |b|.
double relative_max_error(const float* a, const std::vector<float>& b) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    err = std::max(err, double(std::fabs(a[i] - b[i])));
    scale = std::max(scale, double(std::fabs(b[i])));
  }
  return err / std::max(scale, 1e-30);
}

// The first batch of a token stream: tokens [batch, seq] and their targets (shifted by one).
struct Batch {
  Arena arena{MemoryTag::workspace};
  Tensor tokens, targets;
  Batch(const std::vector<int32_t>& stream, int64_t batch, int64_t seq)
      : tokens(arena.alloc({batch, seq}, DType::i32)),
        targets(arena.alloc({batch, seq}, DType::i32)) {
    std::copy(stream.begin(), stream.begin() + batch * seq, tokens.i32());
    std::copy(stream.begin() + 1, stream.begin() + 1 + batch * seq, targets.i32());
  }
};

class TorchParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(TorchParity, LossLogitsAndEveryGradientMatch) {
  const ParityCase pc = GetParam();
  TempDir dir;
  const int64_t batch = 2, seq = 16;
  ModelConfig config = tiny_config(pc.kind, pc.kv_heads, pc.tied);
  if (pc.uneven_ranks) config.ranks = {4, 8, 6, 12, 10, 16, 5};  // q k v o gate up down
  LlamaModel model(config);
  init_for_test(model, 7);
  save_model(model, dir / "model");
  write_random_shard(dir / "tokens.bin", batch * seq + 1, model.config().vocab_size, 11);

  const CommandResult torch = run(fmt::format(
      "{} --checkpoint {} --data {} --batch {} --seq {} --dtype f64 --dump {}", torch_reference(),
      dir / "model", dir / "tokens.bin", batch, seq, dir / "torch.safetensors"));
  ASSERT_EQ(torch.status, 0) << "the PyTorch reference failed (is python3-torch installed?):\n"
                             << torch.output;
  const SafeTensorsReader ref(dir / "torch.safetensors");

  auto be = make_backend("cpu");
  const std::vector<int32_t> stream = read_token_shard(dir / "tokens.bin");
  const Batch b(stream, batch, seq);
  const Tensor tokens = b.tokens, targets = b.targets;
  model.allocate_activations(batch, seq);
  model.zero_grad(*be);
  const float loss = model.forward(*be, tokens, targets);
  model.backward(*be, tokens, targets);

  const float torch_loss = read_all(ref, "loss")[0];
  EXPECT_LE(std::fabs(loss - torch_loss) / std::fabs(torch_loss), 1e-5)
      << loss << " vs " << torch_loss;
  EXPECT_LE(relative_max_error(model.logits().f32(), read_all(ref, "logits")), 1e-5);
  const ParameterStore& params = model.parameters();
  int compared = 0;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const std::string& name = params.specs()[i].name;
    const std::vector<float> expected = read_all(ref, "grad/" + name);
    ASSERT_EQ(int64_t(expected.size()), params.specs()[i].shape.numel()) << name;
    EXPECT_LE(relative_max_error(params.at(i).grad.f32(), expected), 1e-4)
        << "gradient of " << name;
    ++compared;
  }
  EXPECT_EQ(compared, int(params.specs().size()));
}

std::vector<ParityCase> all_cases() {
  std::vector<ParityCase> cases;
  for (BottleneckKind kind :
       {BottleneckKind::none, BottleneckKind::svd, BottleneckKind::cola, BottleneckKind::lax})
    for (int64_t kv : {4, 2})
      for (bool tied : {false, true}) cases.push_back({kind, kv, tied});
  for (BottleneckKind kind : {BottleneckKind::cola, BottleneckKind::lax})
    cases.push_back({kind, 2, false, /*uneven_ranks=*/true});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, TorchParity, ::testing::ValuesIn(all_cases()), case_name);

// cos(a, b) of two gradients.
double cosine(const float* a, const std::vector<float>& b) {
  double ab = 0.0, aa = 0.0, bb = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    ab += double(a[i]) * b[i];
    aa += double(a[i]) * a[i];
    bb += double(b[i]) * b[i];
  }
  return aa == 0.0 && bb == 0.0 ? 1.0 : ab / std::sqrt(aa * bb);
}

// Mixed precision against torch.autocast("cpu", bfloat16) from the same fp32 weights and
// tokens, on both backends (reference: exact bf16 rounding; cpu: what training runs): the
// loss within 5e-3 relative and every parameter's gradient at cosine >= 0.995. The worst
// figures are printed.
class TorchAutocastParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(TorchAutocastParity, Bf16LossAndGradientsMatchAutocast) {
  const ParityCase pc = GetParam();
  TempDir dir;
  // Wider than the fp32 parity's model: at r = 8 LaX's latent LayerNorm gives bf16 rounding
  // more weight than any real model does (autocast itself is then at cosine 0.995 of fp32).
  const int64_t batch = 2, seq = 32;
  ModelConfig config = tiny_config(pc.kind, pc.kv_heads, pc.tied);
  config.hidden_size = 128, config.intermediate_size = 256, config.rank = 32;
  {
    LlamaModel model(config);
    init_for_test(model, 7);
    save_model(model, dir / "model");
  }
  write_random_shard(dir / "tokens.bin", batch * seq + 1, config.vocab_size, 11);
  const CommandResult torch = run(fmt::format(
      "{} --checkpoint {} --data {} --batch {} --seq {} --dtype autocast-bf16 --dump {}",
      torch_reference(), dir / "model", dir / "tokens.bin", batch, seq, dir / "torch.safetensors"));
  ASSERT_EQ(torch.status, 0) << "the PyTorch reference failed (is python3-torch installed?):\n"
                             << torch.output;
  const SafeTensorsReader ref(dir / "torch.safetensors");
  const float torch_loss = read_all(ref, "loss")[0];
  const std::vector<int32_t> stream = read_token_shard(dir / "tokens.bin");
  for (const char* backend : {"reference", "cpu"}) {
    SCOPED_TRACE(backend);
    auto be = make_backend(backend);
    LlamaModel model(config, TensorParallel{&default_tp_layout(config.shape())}, 1, {}, false, *be,
                     DType::bf16);
    load_model_weights(model, dir / "model");
    const Batch b(stream, batch, seq);
    const Tensor tokens = b.tokens, targets = b.targets;
    model.allocate_activations(batch, seq);
    ASSERT_EQ(model.logits().dtype, DType::bf16);
    model.zero_grad(*be);
    const float loss = model.forward(*be, tokens, targets);
    model.backward(*be, tokens, targets);
    const double loss_error = std::fabs(loss - torch_loss) / std::fabs(torch_loss);
    EXPECT_LE(loss_error, 5e-3) << loss << " vs " << torch_loss;
    const ParameterStore& params = model.parameters();
    double worst = 1.0;
    std::string worst_name;
    for (size_t i = 0; i < params.specs().size(); ++i) {
      const std::string& name = params.specs()[i].name;
      const std::vector<float> expected = read_all(ref, "grad/" + name);
      ASSERT_EQ(int64_t(expected.size()), params.specs()[i].shape.numel()) << name;
      ASSERT_EQ(params.at(i).grad.dtype, DType::f32) << name;
      const double c = cosine(params.at(i).grad.f32(), expected);
      EXPECT_GE(c, 0.995) << "gradient of " << name;
      if (c < worst) worst = c, worst_name = name;
    }
    std::printf(
        "%s %s: loss %.6f vs autocast %.6f (relative %.2e); worst gradient cosine %.5f (%s)\n",
        backend, case_name({GetParam(), 0}).c_str(), loss, torch_loss, loss_error, worst,
        worst_name.c_str());
  }
}

std::vector<ParityCase> autocast_cases() {
  std::vector<ParityCase> cases;
  for (BottleneckKind kind :
       {BottleneckKind::none, BottleneckKind::svd, BottleneckKind::cola, BottleneckKind::lax})
    for (int64_t kv : {4, 2}) cases.push_back({kind, kv, false});
  return cases;
}

INSTANTIATE_TEST_SUITE_P(AllKinds, TorchAutocastParity, ::testing::ValuesIn(autocast_cases()),
                         case_name);

}  // namespace
}  // namespace bottle::testing
