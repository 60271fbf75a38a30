// Every layer's backward checked against central finite differences of its forward, on the
// `reference` and the `cpu` backend. For a layer with output y the scalar loss is
// L = Σ c_i·y_i with fixed random c, so the analytic gradients come from backward with
// dy = c; the numerical ones are (L(θ+h) − L(θ−h)) / 2h with L summed in double (h = 1e-2;
// the model uses the five-point stencil). An entry passes when
// |num − ana| <= tol · max(max |ana| over the tensor, floor): tol 1e-2 for layers (every
// entry of tensors up to 64 entries; observed errors ≲ 1e-4), 3e-2 for the model (6 entries
// per tensor, the 3 largest and 3 random; observed ≲ 3e-3). A wrong formula (a dropped
// term, a wrong sign, transpose or scale, a 5-10% error in one term) fails; run with
// BOTTLE_FD_VERBOSE=1 to print the worst error ratio of every tensor. Besides the values, the tests
// check the conventions layers rely on: backward ADDS into every gradient (run twice, get twice),
// Projection leaves a shared (LaX) du zeroed and writes any other, forward(..., residual) adds
// the residual. The whole LlamaModel is checked the same way on a tiny shape, every parameter
// tensor.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "backend/backend.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/parameters.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/projection.h"
#include "nn/rmsnorm.h"

namespace bottle {
namespace {

using Loss = std::function<double()>;

struct FdOptions {
  float h = 1e-2f;      // step
  double tol = 1e-2;    // relative to max(max |ana| over the tensor, floor)
  double floor = 1e-3;  // absolute floor of the scale
  int samples = 64;     // entries checked per tensor (all when the tensor is smaller)
  int largest = 0;      // of which this many are the entries of largest |ana|
  bool five_point = false;
};

// Set BOTTLE_FD_VERBOSE=1 to print the worst error ratio of every checked tensor.
bool verbose() {
  static const bool v = std::getenv("BOTTLE_FD_VERBOSE") != nullptr;
  return v;
}

void fill_normal(Tensor t, std::mt19937& rng, float mean, float std) {
  std::normal_distribution<float> dist(mean, std);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
}

double dot(Tensor c, Tensor y) {
  double s = 0.0;
  for (int64_t i = 0; i < y.numel(); ++i) s += double(c.f32()[i]) * y.f32()[i];
  return s;
}

std::vector<float> copy_of(Tensor t) { return {t.f32(), t.f32() + t.numel()}; }

void zero(Tensor t) { std::fill(t.f32(), t.f32() + t.numel(), 0.0f); }

Param make_param(Arena& arena, Shape shape) { return {arena.alloc(shape), arena.alloc(shape)}; }

double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, double(std::abs(x)));
  return m;
}

std::vector<int64_t> pick_indices(const std::vector<float>& ana, const FdOptions& o,
                                  std::mt19937& rng) {
  const int64_t n = int64_t(ana.size());
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  if (n <= o.samples) return all;
  std::vector<int64_t> picked;
  if (o.largest > 0) {
    std::partial_sort(all.begin(), all.begin() + o.largest, all.end(),
                      [&](int64_t a, int64_t b) { return std::abs(ana[a]) > std::abs(ana[b]); });
    picked.assign(all.begin(), all.begin() + o.largest);
    all.erase(all.begin(), all.begin() + o.largest);
  }
  std::shuffle(all.begin(), all.end(), rng);
  picked.insert(picked.end(), all.begin(), all.begin() + (o.samples - int64_t(picked.size())));
  return picked;
}

// Compares `ana` (a copy of the analytic gradient of `value`) with central differences of
// `loss` on a sample of the entries of `value`, which is restored afterwards.
::testing::AssertionResult check_fd(const std::string& what, Tensor value,
                                    const std::vector<float>& ana, const Loss& loss,
                                    const FdOptions& o, std::mt19937& rng) {
  if (int64_t(ana.size()) != value.numel())
    return ::testing::AssertionFailure() << what << ": gradient size mismatch";
  for (float g : ana)
    if (!std::isfinite(g)) return ::testing::AssertionFailure() << what << ": non-finite gradient";
  const double scale = std::max(max_abs(ana), o.floor);
  const double bound = o.tol * scale;
  double worst = -1.0, worst_num = 0.0, worst_ana = 0.0;
  int64_t worst_index = -1;
  for (int64_t i : pick_indices(ana, o, rng)) {
    float* p = value.f32() + i;
    const float v = *p;
    auto at = [&](float step) {
      *p = v + step;
      const double l = loss();
      *p = v;
      return l;
    };
    // Central difference, or the five-point stencil (error O(h⁴) instead of O(h²)).
    const double num = o.five_point ? (8.0 * (at(o.h) - at(-o.h)) - (at(2 * o.h) - at(-2 * o.h))) /
                                          (12.0 * double(o.h))
                                    : (at(o.h) - at(-o.h)) / (2.0 * double(o.h));
    const double err = std::abs(num - double(ana[i]));
    if (!(err <= worst)) worst = err, worst_index = i, worst_num = num, worst_ana = ana[i];
  }
  loss();  // leave the activations of the unperturbed parameters behind
  if (verbose())
    std::printf("  %-58s max|ana| %.3e  worst err/scale %.2e\n", what.c_str(), max_abs(ana),
                worst / scale);
  if (worst <= bound) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << what << ": at flat index " << worst_index << " numerical " << worst_num
         << " vs analytic " << worst_ana << ", |diff| " << worst << " > " << bound << " (" << o.tol
         << " x max(max |ana| " << max_abs(ana) << ", floor " << o.floor << "))";
}

// `twice` must be `once` doubled (a backward run a second time adds its gradient again).
::testing::AssertionResult check_doubled(const std::string& what, const std::vector<float>& once,
                                         Tensor twice) {
  const double tol = 1e-5 * std::max(max_abs(once), 1e-6);
  for (size_t i = 0; i < once.size(); ++i) {
    const double want = 2.0 * double(once[i]), got = twice.f32()[i];
    if (!(std::abs(got - want) <= tol))
      return ::testing::AssertionFailure()
             << what << ": second backward gave " << got << " at " << i << ", want 2 x " << once[i]
             << " (gradients must be added, scratch state reset)";
  }
  return ::testing::AssertionSuccess();
}

// `again` must be `once` exactly: an activation gradient a backward kernel writes
// (backend/backend.h) does not depend on what the buffer held.
::testing::AssertionResult check_rewritten(const std::string& what, const std::vector<float>& once,
                                           Tensor again) {
  for (size_t i = 0; i < once.size(); ++i)
    if (!(again.f32()[i] == once[i]))
      return ::testing::AssertionFailure()
             << what << ": second backward gave " << again.f32()[i] << " at " << i << ", want "
             << once[i] << " (the gradient is written, not added to)";
  return ::testing::AssertionSuccess();
}

// A tensor the test differentiates by: its value and the gradient backward produced.
struct Checked {
  std::string name;
  Tensor value, grad;
};

class LayersFd : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { be_ = make_backend(GetParam()); }
  Backend& be() { return *be_; }

  std::unique_ptr<Backend> be_;
  std::mt19937 rng_{20240611};
};

std::string backend_test_name(const ::testing::TestParamInfo<std::string>& info) {
  return info.param;
}

INSTANTIATE_TEST_SUITE_P(Backends, LayersFd, ::testing::Values("reference", "cpu"),
                         backend_test_name);

// ---------------------------------------------------------------------------------------
// Projection: full-rank, svd, cola, lax without and with the latent crossing.

struct ProjectionCase {
  const char* name;
  BottleneckKind kind;
  bool crossing;
};

constexpr ProjectionCase kProjectionCases[] = {
    {"none", BottleneckKind::none, false},       {"svd", BottleneckKind::svd, false},
    {"cola", BottleneckKind::cola, false},       {"lax", BottleneckKind::lax, false},
    {"lax_crossing", BottleneckKind::lax, true},
};

class ProjectionFd : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(ProjectionFd, Gradients) {
  auto be = make_backend(std::get<0>(GetParam()));
  const ProjectionCase& pc = kProjectionCases[std::get<1>(GetParam())];
  std::mt19937 rng(7 + std::get<1>(GetParam()));
  const int64_t n = 7, din = 12, dout = 10, r = 5;
  Arena weights(MemoryTag::weights), act(MemoryTag::activations);

  Projection p;
  p.kind = pc.kind;
  p.d_in = din;
  p.d_out = dout;
  p.crossing = pc.crossing;
  std::vector<Checked> checked;
  if (!p.bottleneck()) {
    p.weight = make_param(weights, {dout, din});
    fill_normal(p.weight.value, rng, 0.0f, 1.0f / std::sqrt(float(din)));
    checked.push_back({"weight", p.weight.value, p.weight.grad});
  } else {
    p.rank = r;
    p.A = make_param(weights, {r, din});
    p.B = make_param(weights, {dout, r});
    fill_normal(p.A.value, rng, 0.0f, 1.2f / std::sqrt(float(din)));
    fill_normal(p.B.value, rng, 0.0f, 1.0f / std::sqrt(float(r)));
    checked.push_back({"A", p.A.value, p.A.grad});
    checked.push_back({"B", p.B.value, p.B.grad});
    if (p.crossing) {
      p.G = make_param(weights, {r, r});
      p.ln_w = make_param(weights, {r});
      p.ln_b = make_param(weights, {r});
      fill_normal(p.G.value, rng, 0.0f, 0.8f / std::sqrt(float(r)));
      fill_normal(p.ln_w.value, rng, 1.0f, 0.3f);
      fill_normal(p.ln_b.value, rng, 0.0f, 0.3f);
      checked.push_back({"G", p.G.value, p.G.grad});
      checked.push_back({"ln_w", p.ln_w.value, p.ln_w.grad});
      checked.push_back({"ln_b", p.ln_b.value, p.ln_b.grad});
    }
  }
  p.allocate_activations({act, act, act, act, act}, n);

  Tensor x = act.alloc({n, din}), dx = act.alloc({n, din});
  Tensor y = act.alloc({n, dout}), c = act.alloc({n, dout});
  fill_normal(x, rng, 0.0f, 1.0f);
  fill_normal(c, rng, 0.0f, 1.0f);
  checked.push_back({"x", x, dx});
  Tensor u_prev, du_prev;
  if (p.crossing) {
    u_prev = act.alloc({n, r});
    du_prev = act.alloc({n, r});
    fill_normal(u_prev, rng, 0.2f, 1.0f);
    checked.push_back({"u_prev", u_prev, du_prev});
  }

  const Loss loss = [&] {
    p.forward(*be, y, x, u_prev);
    return dot(c, y);
  };

  // forward(..., residual) adds the residual: read from y itself, or from another tensor
  // (the GEMM's C ≠ D), which it leaves as it was.
  loss();
  const std::vector<float> plain = copy_of(y);
  Tensor residual = act.alloc({n, dout});
  fill_normal(residual, rng, 0.0f, 1.0f);
  const std::vector<float> base = copy_of(residual);
  Tensor y_sum = act.alloc({n, dout});
  fill_normal(y_sum, rng, 0.0f, 1.0f);  // garbage the forward must overwrite
  p.forward(*be, y_sum, x, u_prev, residual);
  for (int64_t i = 0; i < y.numel(); ++i) {
    ASSERT_NEAR(y_sum.f32()[i], base[i] + plain[i], 1e-5f * (1.0f + std::abs(plain[i])))
        << "forward with a residual at " << i;
    ASSERT_EQ(residual.f32()[i], base[i]) << "the residual was written at " << i;
  }
  p.forward(*be, residual, x, u_prev, residual);
  for (int64_t i = 0; i < y.numel(); ++i)
    ASSERT_EQ(residual.f32()[i], y_sum.f32()[i]) << "forward adding into y at " << i;

  // Analytic gradients with dy = c.
  loss();
  for (const Checked& t : checked) zero(t.grad);
  p.backward(*be, dx, c, x, u_prev, du_prev);
  if (p.bottleneck() && p.shares_du()) {
    for (int64_t i = 0; i < p.du.numel(); ++i)
      ASSERT_EQ(p.du.f32()[i], 0.0f) << "Projection::backward must leave a shared du zeroed";
  }
  std::vector<std::vector<float>> ana;
  for (const Checked& t : checked) ana.push_back(copy_of(t.grad));

  // A second backward adds the same again: a shared du was reset, any other is written by B's
  // backward, so what it holds before (NaN here) must not matter.
  if (p.bottleneck() && !p.shares_du())
    for (int64_t i = 0; i < p.du.numel(); ++i) p.du.f32()[i] = std::nanf("");
  p.backward(*be, dx, c, x, u_prev, du_prev);
  for (size_t i = 0; i < checked.size(); ++i)
    EXPECT_TRUE(check_doubled(checked[i].name, ana[i], checked[i].grad));

  FdOptions o;
  for (size_t i = 0; i < checked.size(); ++i)
    EXPECT_TRUE(check_fd(std::string(pc.name) + "." + checked[i].name, checked[i].value, ana[i],
                         loss, o, rng));
}

std::string projection_test_name(
    const ::testing::TestParamInfo<std::tuple<std::string, int>>& info) {
  return std::get<0>(info.param) + "_" + kProjectionCases[std::get<1>(info.param)].name;
}

INSTANTIATE_TEST_SUITE_P(Kinds, ProjectionFd,
                         ::testing::Combine(::testing::Values("reference", "cpu"),
                                            ::testing::Range(0, 5)),
                         projection_test_name);

// ---------------------------------------------------------------------------------------
// RMSNorm: x and γ.

TEST_P(LayersFd, RMSNorm) {
  const int64_t n = 6, cols = 8;
  Arena weights(MemoryTag::weights), act(MemoryTag::activations);
  RMSNorm norm;
  norm.eps = 1e-5f;
  norm.weight = make_param(weights, {cols});
  fill_normal(norm.weight.value, rng_, 1.0f, 0.3f);
  norm.allocate_activations(act, n, cols);
  Tensor x = act.alloc({n, cols}), dx = act.alloc({n, cols}), c = act.alloc({n, cols});
  fill_normal(x, rng_, 0.3f, 1.0f);
  fill_normal(c, rng_, 0.0f, 1.0f);
  const Loss loss = [&] {
    norm.forward(be(), x);
    return dot(c, norm.out);
  };
  const std::vector<Checked> checked = {{"x", x, dx},
                                        {"weight", norm.weight.value, norm.weight.grad}};
  loss();
  for (const Checked& t : checked) zero(t.grad);
  norm.backward(be(), dx, c, x);
  std::vector<std::vector<float>> ana;
  for (const Checked& t : checked) ana.push_back(copy_of(t.grad));
  norm.backward(be(), dx, c, x);
  for (size_t i = 0; i < checked.size(); ++i)
    EXPECT_TRUE(check_doubled(checked[i].name, ana[i], checked[i].grad));
  for (size_t i = 0; i < checked.size(); ++i)
    EXPECT_TRUE(check_fd("rmsnorm." + checked[i].name, checked[i].value, ana[i], loss, {}, rng_));
}

// ---------------------------------------------------------------------------------------
// Attention: q, k, v through RoPE and the causal softmax; MHA and GQA.

void check_attention(Backend& be, std::mt19937& rng, int64_t kv_heads) {
  const int64_t b = 2, s = 5, heads = 4, hd = 4;
  Arena act(MemoryTag::activations);
  Attention attn;
  attn.batch = b;
  attn.seq = s;
  attn.heads = heads;
  attn.kv_heads = kv_heads;
  attn.head_dim = hd;
  attn.rope_theta = 10000.0f;
  attn.allocate_activations(act);
  // The layer rotates q and k in place, so every evaluation starts from the originals.
  Tensor q0 = act.alloc(attn.q_shape()), k0 = act.alloc(attn.kv_shape()),
         v0 = act.alloc(attn.kv_shape());
  Tensor q = act.alloc(attn.q_shape()), k = act.alloc(attn.kv_shape()),
         v = act.alloc(attn.kv_shape());
  Tensor dq = act.alloc(attn.q_shape()), dk = act.alloc(attn.kv_shape()),
         dv = act.alloc(attn.kv_shape()), c = act.alloc(attn.q_shape());
  fill_normal(q0, rng, 0.0f, 1.2f);
  fill_normal(k0, rng, 0.0f, 1.2f);
  fill_normal(v0, rng, 0.0f, 1.0f);
  fill_normal(c, rng, 0.0f, 1.0f);
  const Loss loss = [&] {
    std::copy(q0.f32(), q0.f32() + q0.numel(), q.f32());
    std::copy(k0.f32(), k0.f32() + k0.numel(), k.f32());
    std::copy(v0.f32(), v0.f32() + v0.numel(), v.f32());
    attn.forward(be, q, k, v);
    return dot(c, attn.out);
  };
  const std::vector<Checked> checked = {{"q", q0, dq}, {"k", k0, dk}, {"v", v0, dv}};
  loss();
  for (const Checked& t : checked) zero(t.grad);
  attn.backward(be, dq, dk, dv, c, q, k, v);
  std::vector<std::vector<float>> ana;
  for (const Checked& t : checked) ana.push_back(copy_of(t.grad));
  // The gradients are written: a second backward into the same buffers gives them again.
  attn.backward(be, dq, dk, dv, c, q, k, v);
  for (size_t i = 0; i < checked.size(); ++i)
    EXPECT_TRUE(check_rewritten(checked[i].name, ana[i], checked[i].grad));
  const std::string prefix = kv_heads == heads ? "mha." : "gqa.";
  for (size_t i = 0; i < checked.size(); ++i)
    EXPECT_TRUE(check_fd(prefix + checked[i].name, checked[i].value, ana[i], loss, {}, rng));
}

TEST_P(LayersFd, AttentionMHA) { check_attention(be(), rng_, 4); }
TEST_P(LayersFd, AttentionGQA) { check_attention(be(), rng_, 2); }

// ---------------------------------------------------------------------------------------
// Embedding: the table's gradient (repeated tokens accumulate).

TEST_P(LayersFd, Embedding) {
  const int64_t vocab = 7, cols = 5, n = 10;
  Arena weights(MemoryTag::weights), act(MemoryTag::activations);
  Embedding emb;
  emb.table = make_param(weights, {vocab, cols});
  fill_normal(emb.table.value, rng_, 0.0f, 1.0f);
  Tensor tokens = act.alloc({n}, DType::i32), out = act.alloc({n, cols}), c = act.alloc({n, cols});
  const int32_t ids[n] = {3, 0, 3, 6, 1, 3, 0, 5, 6, 2};  // 4 unused, 3 three times
  std::copy(ids, ids + n, tokens.i32());
  fill_normal(c, rng_, 0.0f, 1.0f);
  const Loss loss = [&] {
    emb.forward(be(), out, tokens);
    return dot(c, out);
  };
  loss();
  zero(emb.table.grad);
  emb.backward(be(), c, tokens);
  const std::vector<float> ana = copy_of(emb.table.grad);
  emb.backward(be(), c, tokens);
  EXPECT_TRUE(check_doubled("table", ana, emb.table.grad));
  for (int64_t j = 0; j < cols; ++j) EXPECT_EQ(ana[4 * cols + j], 0.0f) << "unused row 4";
  EXPECT_TRUE(check_fd("embedding.table", emb.table.value, ana, loss, {}, rng_));
}

// ---------------------------------------------------------------------------------------
// CrossEntropy: logits, through backward(dlogits, targets, scale).

TEST_P(LayersFd, CrossEntropy) {
  const int64_t n = 6, vocab = 9;
  const float scale = 0.37f;
  Arena act(MemoryTag::activations);
  CrossEntropy ce;
  ce.allocate_activations(act, n, vocab);
  Tensor logits = act.alloc({n, vocab}), dlogits = act.alloc({n, vocab});
  Tensor targets = act.alloc({n}, DType::i32);
  const int32_t ids[n] = {0, 8, 3, 3, 5, 1};
  std::copy(ids, ids + n, targets.i32());
  fill_normal(logits, rng_, 0.0f, 2.0f);
  // L = scale · Σ losses, in double.
  double mean = 0.0;
  const Loss loss = [&] {
    mean = ce.forward(be(), logits, targets);
    double s = 0.0;
    for (int64_t i = 0; i < n; ++i) s += ce.losses.f32()[i];
    return double(scale) * s;
  };
  const double total = loss();
  EXPECT_NEAR(mean, total / scale / double(n), 1e-5) << "forward returns the mean loss";
  zero(dlogits);
  ce.backward(be(), dlogits, targets, scale);
  const std::vector<float> ana = copy_of(dlogits);
  ce.backward(be(), dlogits, targets, scale);
  EXPECT_TRUE(check_rewritten("logits", ana, dlogits));
  EXPECT_TRUE(check_fd("cross_entropy.logits", logits, ana, loss, {}, rng_));
}

// ---------------------------------------------------------------------------------------
// SwiGLU through the backend, with and without SiLU on the gate.

TEST_P(LayersFd, SwiGLU) {
  const int64_t n = 4, cols = 6;
  for (bool gate_act : {true, false}) {
    SCOPED_TRACE(gate_act ? "gate_act" : "no gate_act");
    Arena act(MemoryTag::activations);
    Tensor gate = act.alloc({n, cols}), up = act.alloc({n, cols}), out = act.alloc({n, cols});
    Tensor dgate = act.alloc({n, cols}), dup = act.alloc({n, cols}), c = act.alloc({n, cols});
    fill_normal(gate, rng_, 0.0f, 1.5f);
    fill_normal(up, rng_, 0.0f, 1.5f);
    fill_normal(c, rng_, 0.0f, 1.0f);
    const Loss loss = [&] {
      be().swiglu_forward(out, gate, up, gate_act);
      return dot(c, out);
    };
    const std::vector<Checked> checked = {{"gate", gate, dgate}, {"up", up, dup}};
    loss();
    for (const Checked& t : checked) zero(t.grad);
    be().swiglu_backward(dgate, dup, c, gate, up, gate_act);
    std::vector<std::vector<float>> ana;
    for (const Checked& t : checked) ana.push_back(copy_of(t.grad));
    be().swiglu_backward(dgate, dup, c, gate, up, gate_act);
    for (size_t i = 0; i < checked.size(); ++i)
      EXPECT_TRUE(check_rewritten(checked[i].name, ana[i], checked[i].grad));
    for (size_t i = 0; i < checked.size(); ++i)
      EXPECT_TRUE(check_fd("swiglu." + checked[i].name, checked[i].value, ana[i], loss, {}, rng_));
  }
}

// ---------------------------------------------------------------------------------------
// The whole model: every parameter tensor of a tiny LLaMA, per bottleneck kind, tied and
// untied embeddings.

using ModelParam = std::tuple<std::string, BottleneckKind, bool>;

class ModelFd : public ::testing::TestWithParam<ModelParam> {};

// Mean cross-entropy of the logits, in double.
double mean_cross_entropy(Tensor logits, Tensor targets) {
  const int64_t n = logits.rows(), v = logits.cols();
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.f32() + i * v;
    double mx = row[0];
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, double(row[j]));
    double s = 0.0;
    for (int64_t j = 0; j < v; ++j) s += std::exp(double(row[j]) - mx);
    total += mx + std::log(s) - double(row[targets.i32()[i]]);
  }
  return total / double(n);
}

TEST_P(ModelFd, EveryParameter) {
  const auto& [backend, kind, tied] = GetParam();
  auto be = make_backend(backend);
  ModelConfig cfg;
  cfg.vocab_size = 32;
  cfg.hidden_size = 16;
  cfg.intermediate_size = 24;
  cfg.num_layers = 2;
  cfg.num_heads = 4;
  cfg.num_kv_heads = 2;
  cfg.max_seq_len = 16;
  cfg.tie_embeddings = tied;
  cfg.bottleneck = kind;
  const int64_t batch = 2, seq = 6;

  LlamaModel model(cfg);
  model.init_weights(1234);
  // The init's 0.02 scale leaves the model nearly linear (uniform attention, SiLU ≈ x/2) and
  // the gradients tiny; rescale every normal-initialised tensor to unit-variance outputs
  // and move norm weights and biases off 1 and 0 so that their gradients matter.
  ParameterStore& params = model.parameters();
  std::mt19937 rng(99 + int(kind) * 2 + int(tied));
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const Tensor v = params.at(i).value;
    if (spec.init == ParamInit::normal) {
      const bool table = spec.name == "model.embed_tokens.weight";
      const float target = table ? 1.0f : 1.0f / std::sqrt(float(spec.shape[1]));
      for (int64_t j = 0; j < v.numel(); ++j) v.f32()[j] *= target / spec.std;
    } else {
      std::normal_distribution<float> dist(0.0f, 0.2f);
      for (int64_t j = 0; j < v.numel(); ++j) v.f32()[j] += dist(rng);
    }
  }
  model.allocate_activations(batch, seq);

  Arena act(MemoryTag::activations);
  Tensor tokens = act.alloc({batch, seq}, DType::i32),
         targets = act.alloc({batch, seq}, DType::i32);
  std::uniform_int_distribution<int32_t> token(0, int32_t(cfg.vocab_size) - 1);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.i32()[i] = token(rng);
    targets.i32()[i] = token(rng);
  }

  const Loss loss = [&] {
    model.forward(*be, tokens, targets);
    return mean_cross_entropy(model.logits(), targets);
  };
  const float returned = model.forward(*be, tokens, targets);
  EXPECT_NEAR(returned, mean_cross_entropy(model.logits(), targets), 1e-5 * std::abs(returned));

  model.zero_grad(*be);
  model.backward(*be, tokens, targets);
  const std::vector<float> grads = copy_of(params.grads());
  // Forward + backward again accumulates the same gradient (du of the lax crossing, the
  // activation scratch and the loss gradient must all be reset between steps).
  model.forward(*be, tokens, targets);
  model.backward(*be, tokens, targets);
  EXPECT_TRUE(check_doubled("all gradients", grads, params.grads()));

  FdOptions o;
  o.h = 1e-2f;
  o.five_point = true;  // the lax latents' LayerNorm over r = 4 is sharply curved
  o.tol = 3e-2;
  o.floor = 1e-4;
  o.samples = 6;
  o.largest = 3;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const Param p = params.at(i);
    const std::vector<float> ana(grads.begin() + spec.offset,
                                 grads.begin() + spec.offset + spec.shape.numel());
    EXPECT_TRUE(check_fd(spec.name, p.value, ana, loss, o, rng));
  }
}

std::string model_test_name(const ::testing::TestParamInfo<ModelParam>& info) {
  return std::get<0>(info.param) + "_" + bottleneck_kind_name(std::get<1>(info.param)) +
         (std::get<2>(info.param) ? "_tied" : "_untied");
}

INSTANTIATE_TEST_SUITE_P(
    Configs, ModelFd,
    ::testing::Combine(::testing::Values("reference", "cpu"),
                       ::testing::Values(BottleneckKind::none, BottleneckKind::svd,
                                         BottleneckKind::cola, BottleneckKind::lax),
                       ::testing::Bool()),
    model_test_name);

}  // namespace
}  // namespace bottle
