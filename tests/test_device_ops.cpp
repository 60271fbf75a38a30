// Every Backend op on a backend named on the command line (`cuda` by default, `cpu` in CI so
// that the harness itself is exercised everywhere), against the `reference` backend, in f32
// and in bf16, with the same random inputs, in the spirit of ggml's test-backend-ops. Unlike
// test_backend_ops, nothing here reads tensor memory directly: every input is staged with
// from_host and every output read back with to_host, so the backend under test may keep its
// tensors in device memory. The backward kernels are also checked against central finite
// differences of the same backend's forward kernels (directional derivatives, f32).
//
//   test_device_ops [BACKEND] [gtest flags]     exit 77 (ctest: skipped) when BACKEND cannot
//                                               run here, printing why
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backend_test_main.h"
#include "core/arena.h"
#include "core/backend.h"
#include "core/backend_options.h"
#include "core/bf16.h"

namespace bottle {
namespace {

std::string g_backend = "cuda";

enum class Init { normal, positive, ids, zeros };

// One tensor argument of an op. `act`: an activation, bf16 when the case runs in bf16 (the
// dtype policy of training.precision = "bf16"); otherwise it stays f32 (statistics, parameter
// gradients, optimizer state). `dtype` forces one.
struct Arg {
  Shape shape;
  Init init = Init::normal;
  bool act = true;
  int32_t vocab = 0;  // ids: values in [0, vocab)
  std::optional<DType> dtype;
  float stddev = 1.0f;
};

struct Op {
  std::string name;
  std::vector<Arg> args;
  std::vector<int> outputs;  // the arguments compared after the op
  std::function<void(Backend&, const std::vector<Tensor>&)> run;
  // Tolerances: normalised MSE and max abs error relative to the largest reference value.
  double f32_nmse = 1e-9, f32_rel = 1e-4;
  double bf16_nmse = 1e-4, bf16_rel = 2e-2;
};

struct HostData {
  std::vector<std::vector<float>> values;  // ids as floats (exact below 2^24)
};

HostData make_inputs(const Op& op, uint32_t seed) {
  std::mt19937 rng(seed);
  HostData h;
  for (const Arg& a : op.args) {
    std::vector<float> v(size_t(a.shape.numel()));
    std::normal_distribution<float> normal(0.0f, a.stddev);
    std::uniform_real_distribution<float> positive(0.5f, 2.0f);
    for (float& x : v) {
      switch (a.init) {
        case Init::normal:
          x = normal(rng);
          break;
        case Init::positive:
          x = positive(rng);
          break;
        case Init::ids:
          x = float(std::uniform_int_distribution<int32_t>(0, a.vocab - 1)(rng));
          break;
        case Init::zeros:
          x = 0.0f;
          break;
      }
    }
    h.values.push_back(std::move(v));
  }
  return h;
}

DType dtype_of(const Arg& a, bool bf16) {
  if (a.dtype) return *a.dtype;
  if (a.init == Init::ids) return DType::i32;
  return bf16 && a.act ? DType::bf16 : DType::f32;
}

void stage_in(Backend& be, Tensor t, const std::vector<float>& v) {
  if (t.dtype == DType::i32) {
    std::vector<int32_t> ids(v.begin(), v.end());
    be.from_host(t, ids.data());
  } else if (t.dtype == DType::bf16) {
    std::vector<uint16_t> bits(v.size());
    for (size_t i = 0; i < v.size(); ++i) bits[i] = bf16_from_float(v[i]);
    be.from_host(t, bits.data());
  } else {
    be.from_host(t, v.data());
  }
}

std::vector<float> stage_out(Backend& be, Tensor t) {
  std::vector<float> v(size_t(t.numel()));
  if (t.dtype == DType::bf16) {
    std::vector<uint16_t> bits(v.size());
    be.to_host(bits.data(), t);
    for (size_t i = 0; i < v.size(); ++i) v[i] = bf16_to_float(bits[i]);
  } else if (t.dtype == DType::i32) {
    std::vector<int32_t> ids(v.size());
    be.to_host(ids.data(), t);
    for (size_t i = 0; i < v.size(); ++i) v[i] = float(ids[i]);
  } else {
    be.to_host(v.data(), t);
  }
  return v;
}

// Runs `op` on `be` with `inputs`; returns every compared output.
std::vector<std::vector<float>> run_op(Backend& be, const Op& op, const HostData& inputs,
                                       bool bf16) {
  Arena arena(MemoryTag::workspace, be);
  std::vector<Tensor> ts;
  for (size_t i = 0; i < op.args.size(); ++i) {
    ts.push_back(arena.alloc(op.args[i].shape, dtype_of(op.args[i], bf16)));
    stage_in(be, ts.back(), inputs.values[i]);
  }
  op.run(be, ts);
  std::vector<std::vector<float>> out;
  for (int i : op.outputs) out.push_back(stage_out(be, ts[size_t(i)]));
  return out;
}

::testing::AssertionResult close(const std::vector<float>& got, const std::vector<float>& want,
                                 double max_nmse, double max_rel) {
  double err2 = 0, ref2 = 0, max_err = 0, max_ref = 0;
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isfinite(want[i]) != std::isfinite(got[i]))
      return ::testing::AssertionFailure()
             << "element " << i << ": got " << got[i] << ", want " << want[i];
    if (!std::isfinite(want[i])) continue;
    const double d = double(got[i]) - want[i];
    err2 += d * d, ref2 += double(want[i]) * want[i];
    if (std::abs(d) > max_err) max_err = std::abs(d), worst = i;
    max_ref = std::max(max_ref, std::abs(double(want[i])));
  }
  const double nmse = ref2 > 0 ? err2 / ref2 : err2;
  const double rel = max_ref > 0 ? max_err / max_ref : max_err;
  if (nmse <= max_nmse && rel <= max_rel) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "nmse " << nmse << " (max " << max_nmse << "), max abs err " << max_err << " / "
         << max_ref << " = " << rel << " (max " << max_rel << "); worst at " << worst << ": got "
         << got[worst] << ", want " << want[worst];
}

class DeviceOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> target = make_backend(g_backend);
  std::unique_ptr<Backend> oracle = make_backend("reference");

  void check(const Op& op, uint32_t seed = 7) {
    for (bool bf16 : {false, true}) {
      SCOPED_TRACE(op.name + (bf16 ? " (bf16)" : " (f32)") + " on " + g_backend);
      const HostData inputs = make_inputs(op, seed);
      const auto want = run_op(*oracle, op, inputs, bf16);
      const auto got = run_op(*target, op, inputs, bf16);
      for (size_t i = 0; i < want.size(); ++i) {
        SCOPED_TRACE("output argument " + std::to_string(op.outputs[i]));
        EXPECT_TRUE(close(got[i], want[i], bf16 ? op.bf16_nmse : op.f32_nmse,
                          bf16 ? op.bf16_rel : op.f32_rel));
      }
    }
  }
};

// ---------------------------------------------------------------------------------------
// GEMM: every transpose pair, batches with gaps, broadcast operands, alpha and beta, and the
// operand dtype mixes a bf16 run makes (bf16 × bf16 → bf16 or f32 gradients, f32 × bf16).

struct GemmShape {
  bool ta, tb;
  int64_t m, n, k, batch, pad;
  float alpha, beta;
  bool broadcast_a = false, broadcast_b = false;
};

Op gemm_op(const GemmShape& g, std::optional<DType> a_type = {}, std::optional<DType> c_type = {}) {
  const int64_t a_rows = g.ta ? g.k : g.m, a_cols = g.ta ? g.m : g.k;
  const int64_t b_rows = g.tb ? g.n : g.k, b_cols = g.tb ? g.k : g.n;
  const int64_t lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.n + g.pad;
  const int64_t sa = g.broadcast_a ? 0 : a_rows * lda + (g.pad ? 5 : 0);
  const int64_t sb = g.broadcast_b ? 0 : b_rows * ldb + g.pad;
  const int64_t sc = g.m * ldc + (g.pad ? 3 : 0);
  Op op;
  op.name = fmt::format("gemm ta={} tb={} m={} n={} k={} batch={} pad={} alpha={} beta={}{}{}",
                        g.ta, g.tb, g.m, g.n, g.k, g.batch, g.pad, g.alpha, g.beta,
                        g.broadcast_a ? " broadcast A" : "", g.broadcast_b ? " broadcast B" : "");
  op.args = {{{g.broadcast_a ? a_rows * lda : g.batch * sa}, Init::normal, true, 0, a_type},
             {{g.broadcast_b ? b_rows * ldb : g.batch * sb}},
             {{g.batch * sc}, Init::normal, true, 0, c_type}};
  op.outputs = {2};
  op.run = [=](Backend& be, const std::vector<Tensor>& t) {
    GemmArgs a;
    a.trans_a = g.ta, a.trans_b = g.tb, a.m = g.m, a.n = g.n, a.k = g.k, a.batch = g.batch;
    a.alpha = g.alpha, a.beta = g.beta;
    a.a = t[0].data, a.lda = lda, a.stride_a = sa;
    a.b = t[1].data, a.ldb = ldb, a.stride_b = sb;
    a.c = t[2].data, a.ldc = ldc, a.stride_c = sc;
    a.dtypes_of(t[0], t[1], t[2]);
    be.gemm(a);
  };
  return op;
}

TEST_F(DeviceOps, Gemm) {
  for (bool ta : {false, true})
    for (bool tb : {false, true}) check(gemm_op({ta, tb, 37, 29, 45, 1, 0, 1.0f, 0.0f}));
  check(gemm_op({false, true, 64, 96, 128, 3, 3, 0.5f, 1.0f}));
  check(gemm_op({true, false, 33, 17, 70, 2, 1, 1.0f, 0.25f}));
  check(gemm_op({false, false, 40, 24, 32, 3, 0, 1.0f, 0.0f, true, false}));
  check(gemm_op({false, true, 40, 24, 32, 3, 2, 1.0f, 1.0f, false, true}));
  check(gemm_op({false, false, 200, 136, 264, 1, 0, 1.0f, 0.0f}));
  // bf16 × bf16 → f32 (a parameter gradient) and f32 × bf16 (a mix cuBLASLt lacks).
  check(gemm_op({true, false, 48, 40, 56, 1, 0, 1.0f, 1.0f}, {}, DType::f32));
  check(gemm_op({false, true, 48, 40, 56, 2, 1, 1.0f, 0.0f}, DType::f32));
}

// ---------------------------------------------------------------------------------------
// Layer kernels. Shapes are small and odd, so that tiles and vector widths have remainders.

constexpr int64_t N = 37, C = 48;

TEST_F(DeviceOps, Embedding) {
  constexpr int32_t V = 20;
  check(
      {"embedding_forward",
       {{{N}, Init::ids, false, V}, {{V, C}}, {{N, C}}},
       {2},
       [](Backend& be, const std::vector<Tensor>& t) { be.embedding_forward(t[2], t[0], t[1]); }});
  check(
      {"embedding_backward",
       {{{N}, Init::ids, false, V}, {{V, C}, Init::normal, false}, {{N, C}}},
       {1},
       [](Backend& be, const std::vector<Tensor>& t) { be.embedding_backward(t[1], t[0], t[2]); }});
  check({"embedding_shard",
         {{{N}, Init::ids, false, V}, {{7, C}}, {{N, C}}, {{7, C}, Init::normal, false}},
         {2, 3},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.embedding_shard_forward(t[2], t[0], t[1], 5);
           be.embedding_shard_backward(t[3], t[0], t[2], 5);
         }});
}

TEST_F(DeviceOps, Norms) {
  check({"rmsnorm_forward",
         {{{N, C}}, {{N}, Init::zeros, false}, {{C}}, {{N, C}}},
         {1, 3},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.rmsnorm_forward(t[3], t[1], t[0], t[2], 1e-5f);
         }});
  // The fused residual add + RMSNorm against the reference's composition of the two ops.
  check({"residual_rmsnorm_forward",
         {{{N, C}},
          {{N, C}},
          {{C}},
          {{N, C}, Init::zeros},
          {{N, C}, Init::zeros},
          {{N}, Init::zeros, false}},
         {3, 4, 5},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.residual_rmsnorm_forward(t[3], t[4], t[5], t[0], t[1], t[2], 1e-5f);
         }});
  check({"rmsnorm_backward",
         {{{N, C}},
          {{C}, Init::normal, false},
          {{N, C}},
          {{N, C}},
          {{C}},
          {{N}, Init::positive, false}},
         {0, 1},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]);
         }});
  check({"rmsnorm_shard",
         {{{N, C}}, {{N}, Init::zeros, false}, {{C}}, {{N, C}}},
         {1, 3},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.rmsnorm_shard_forward(t[3], t[1], t[0], t[2], 1e-5f);
         }});
  check({"rmsnorm_shard_backward",
         {{{N, C}},
          {{C}, Init::normal, false},
          {{N, C}},
          {{N, C}},
          {{C}},
          {{N}, Init::positive, false},
          {{N}, Init::normal, false}},
         {0, 1},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.rmsnorm_shard_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], 3 * C);
         }});
  check({"layernorm_forward",
         {{{N, C}}, {{N}, Init::zeros, false}, {{N}, Init::zeros, false}, {{C}}, {{C}}, {{N, C}}},
         {1, 2, 5},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.layernorm_forward(t[5], t[1], t[2], t[0], t[3], t[4], 1e-5f);
         }});
  check({"layernorm_backward",
         {{{N, C}},
          {{C}, Init::normal, false},
          {{C}, Init::normal, false},
          {{N, C}},
          {{N, C}},
          {{C}},
          {{N}, Init::normal, false},
          {{N}, Init::positive, false}},
         {0, 1, 2},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
         }});
}

TEST_F(DeviceOps, Rope) {
  check({"rope",
         {{{2, 13, 3, 16}}, {{2, 13, 3, 16}}},
         {0, 1},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.rope_forward(t[0], 10000.0f);
           be.rope_backward(t[1], 500000.0f);
         }});
}

Op attention_op(int64_t b, int64_t s, int64_t h, int64_t hkv, int64_t hd) {
  Op op;
  op.name = fmt::format("attention B={} S={} H={} Hkv={} hd={}", b, s, h, hkv, hd);
  // q k v out lse | dq dk dv dout
  op.args = {{{b, s, h, hd}},
             {{b, s, hkv, hd}},
             {{b, s, hkv, hd}},
             {{b, s, h, hd}},
             {{b, h, s}, Init::zeros, false},
             {{b, s, h, hd}},
             {{b, s, hkv, hd}},
             {{b, s, hkv, hd}},
             {{b, s, h, hd}}};
  op.outputs = {3, 4, 5, 6, 7};
  op.run = [](Backend& be, const std::vector<Tensor>& t) {
    be.attention_forward(t[3], t[4], t[0], t[1], t[2]);
    be.attention_backward(t[5], t[6], t[7], t[8], t[3], t[4], t[0], t[1], t[2]);
  };
  return op;
}

TEST_F(DeviceOps, Attention) {
  check(attention_op(2, 37, 4, 2, 16));
  check(attention_op(1, 70, 2, 1, 64));
  check(attention_op(1, 130, 2, 2, 128));
  check(attention_op(1, 9, 3, 3, 8));
  // Longer sequences through the cuda backend's tensor-core path (bf16, hd 64 / 128): several
  // key and query tiles, a ragged last tile, GQA groups of 2 and 4.
  check(attention_op(2, 300, 4, 2, 128));
  check(attention_op(1, 257, 4, 1, 64));
}

// cuDNN's SDPA (the cuda backend under attention "cudnn", which fails rather than fall back)
// against the reference backend and against the same GPU's own kernels (attention "own"), in
// bf16 (cuDNN's SDPA has no fp32): out, lse, and dq, dk, dv added into non-zero gradients. GQA
// and sequence lengths that are not multiples of cuDNN's 64- or 128-row tiles. Skipped, saying
// why, where cuDNN cannot be loaded or the backend under test is not cuda.
class CudnnAttentionOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (g_backend != "cuda")
      GTEST_SKIP() << "cuDNN attention runs on the cuda backend; this run tests '" << g_backend
                   << "'";
    try {
      cudnn = make_backend("cuda", {AttentionChoice::cudnn});
    } catch (const Error& e) {
      GTEST_SKIP() << "cuDNN attention is not available here: " << e.what();
    }
    own = make_backend("cuda", {AttentionChoice::own});
  }

  void check(int64_t b, int64_t s, int64_t h, int64_t hkv, int64_t hd) {
    const Op op = attention_op(b, s, h, hkv, hd);
    SCOPED_TRACE(op.name + " (bf16), cuDNN");
    const std::string path = cudnn->attention_path(b, s, h, hkv, hd, DType::bf16);
    EXPECT_EQ(path.rfind("cuDNN ", 0), 0u) << path;
    const HostData inputs = make_inputs(op, 11);
    const auto want = run_op(*oracle, op, inputs, true);
    const auto own_got = run_op(*own, op, inputs, true);
    const auto got = run_op(*cudnn, op, inputs, true);
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("output argument " + std::to_string(op.outputs[i]));
      EXPECT_TRUE(close(got[i], want[i], op.bf16_nmse, op.bf16_rel)) << "cuDNN vs reference";
      EXPECT_TRUE(close(got[i], own_got[i], op.bf16_nmse, op.bf16_rel)) << "cuDNN vs own";
      EXPECT_TRUE(close(own_got[i], want[i], op.bf16_nmse, op.bf16_rel)) << "own vs reference";
    }
    // The deterministic backward: the same inputs give the same bits.
    EXPECT_TRUE(got == run_op(*cudnn, op, inputs, true)) << "two cuDNN runs differ";
  }

  std::unique_ptr<Backend> cudnn, own;
  std::unique_ptr<Backend> oracle = make_backend("reference");
};

TEST_F(CudnnAttentionOps, AgainstReferenceAndOwnKernels) {
  check(2, 100, 4, 2, 64);
  check(1, 130, 4, 2, 128);
  check(2, 256, 4, 2, 64);
  check(1, 256, 4, 4, 128);
  check(1, 257, 4, 1, 64);
  check(2, 37, 2, 2, 128);
}

// Where a run says which attention it runs: the host backends have their one kernel, refuse
// cuDNN's by name, and the cuda backend under "own" says so without opening cuDNN.
TEST(AttentionPath, NamesTheKernelsAndRefusesCudnnOnTheHost) {
  for (const char* name : {"cpu", "reference"}) {
    EXPECT_EQ(make_backend(name)->attention_path(2, 64, 4, 2, 32, DType::bf16), "own CPU kernel");
    try {
      make_backend(name, {AttentionChoice::cudnn});
      ADD_FAILURE() << name << " took attention \"cudnn\"";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no cuDNN attention"), std::string::npos) << e.what();
    }
  }
  if (g_backend == "cuda") {
    const std::string path =
        make_backend("cuda", {AttentionChoice::own})->attention_path(2, 64, 4, 2, 64, DType::bf16);
    EXPECT_EQ(path, "own kernels (attention \"own\")");
    const std::string f32 = make_backend("cuda")->attention_path(2, 64, 4, 2, 64, DType::f32);
    EXPECT_EQ(f32.rfind("own kernels (", 0), 0u) << f32;
  }
}

TEST_F(DeviceOps, Activations) {
  check({"silu",
         {{{N, C}}, {{N, C}}, {{N, C}}, {{N, C}}},
         {1, 2},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.silu_forward(t[1], t[0]);
           be.silu_backward(t[2], t[3], t[0]);
         }});
  for (bool gate_act : {true, false})
    check({gate_act ? "swiglu" : "bilinear glu",
           {{{N, C}}, {{N, C}}, {{N, C}}, {{N, C}}, {{N, C}}, {{N, C}}},
           {2, 3, 4},
           [gate_act](Backend& be, const std::vector<Tensor>& t) {
             be.swiglu_forward(t[2], t[0], t[1], gate_act);
             be.swiglu_backward(t[3], t[4], t[5], t[0], t[1], gate_act);
           }});
}

TEST_F(DeviceOps, Elementwise) {
  const Shape s{N, C};
  check({"add and accumulate",
         {{s}, {s}, {s}, {s}},
         {2, 3},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.add(t[2], t[0], t[1]);
           be.add(t[0], t[0], t[1]);  // aliasing its input
           be.accumulate(t[3], t[0]);
         }});
  check({"scale, multiply, divide",
         {{s}, {s}, {s, Init::positive}, {s}},
         {0, 3},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.scale(t[0], -0.75f);
           be.multiply(t[3], t[0], t[1]);
           be.divide(t[3], t[3], t[2]);
         }});
  check({"fill_zero", {{s}}, {0}, [](Backend& be, const std::vector<Tensor>& t) {
           be.fill_zero(t[0]);
         }});
  check({"rms_from_sum_squares",
         {{{N}, Init::positive, false}, {{N}, Init::zeros, false}, {{N}, Init::zeros, false}},
         {1, 2},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.rms_from_sum_squares(t[1], t[0], 48.0f, 1e-5f, false);
           be.rms_from_sum_squares(t[2], t[0], 48.0f, 1e-5f, true);
         }});
  check({"scale_rows, row_dot",
         {{s}, {{N}, Init::normal, false}, {s}, {s}, {{N}, Init::zeros, false}},
         {2, 4},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.scale_rows(t[2], t[0], t[1]);
           be.row_dot(t[4], t[0], t[3]);
         }});
}

TEST_F(DeviceOps, Reductions) {
  for (bool bf16 : {false, true}) {
    Op op{"sums", {{{N * 100 + 3}}}, {}, nullptr};
    const HostData in = make_inputs(op, 11);
    double got[2], want[2];
    for (Backend* be : {target.get(), oracle.get()}) {
      Arena arena(MemoryTag::workspace, *be);
      Tensor x = arena.alloc(op.args[0].shape, bf16 ? DType::bf16 : DType::f32);
      stage_in(*be, x, in.values[0]);
      double* out = be == target.get() ? got : want;
      out[0] = be->sum(x), out[1] = be->sum_squares(x);
    }
    EXPECT_NEAR(got[0], want[0], 1e-9 * want[1]) << g_backend << (bf16 ? " bf16" : " f32");
    EXPECT_NEAR(got[1], want[1], 1e-12 * want[1]) << g_backend << (bf16 ? " bf16" : " f32");
  }
}

TEST_F(DeviceOps, CrossEntropy) {
  constexpr int32_t V = 300;
  check({"cross_entropy",
         {{{N, V}}, {{N}, Init::ids, false, V}, {{N}, Init::zeros, false}, {{N, V}}, {{N, V}}},
         {2, 3, 4},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.cross_entropy_forward(t[2], t[3], t[0], t[1]);
           be.cross_entropy_backward(t[4], t[3], t[1], 0.125f);
         }});
  // A vocabulary shard holding columns [120, 220) of 300.
  check({"vocab-parallel cross_entropy",
         {{{N, 100}, Init::normal, true, 0, {}, 3.0f},
          {{N}, Init::ids, false, V},
          {{N}, Init::zeros, false},
          {{N}, Init::zeros, false},
          {{N}, Init::normal, false},
          {{N}, Init::zeros, false},
          {{N}, Init::zeros, false},
          {{N}, Init::zeros, false},
          {{N, 100}}},
         {2, 3, 5, 6, 7, 8},
         [](Backend& be, const std::vector<Tensor>& t) {
           // The shard's statistics; a whole-row max that differs from the local one, as
           // another shard's larger logits make it; the partials, losses and gradient.
           be.logits_row_stats(t[2], t[3], t[0]);
           be.add(t[4], t[2], t[4]);
           be.cross_entropy_shard_partials(t[5], t[6], t[3], t[2], t[4], t[0], t[1], 120);
           be.cross_entropy_shard_losses(t[7], t[5], t[6], t[4]);
           be.cross_entropy_shard_backward(t[8], t[0], t[4], t[5], t[1], 120, 0.5f);
         }});
}

TEST_F(DeviceOps, CopiesAndIds) {
  check({"copy across dtypes",
         {{{N, C}, Init::normal, true, 0, DType::f32},
          {{N, C}, Init::zeros, true, 0, DType::bf16},
          {{N, C}, Init::zeros, true, 0, DType::f32}},
         {1, 2},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.copy(t[1], t[0]);
           be.copy(t[2], t[1]);
         }});
  check({"copy_columns",
         {{{N, C}}, {{N, 20}}, {{N, C}, Init::normal, true, 0, DType::f32}},
         {1, 2},
         [](Backend& be, const std::vector<Tensor>& t) {
           be.copy_columns(t[1], 3, t[0], 17, 11);
           be.copy_columns(t[2], 30, t[1], 0, 18);  // converting when t[1] is bf16
         }});
  for (Backend* be : {target.get(), oracle.get()}) {
    Arena arena(MemoryTag::workspace, *be);
    Tensor ids = arena.alloc({N}, DType::i32);
    std::vector<int32_t> host(N, 4);
    host[21] = 9, host[30] = -1;
    be->from_host(ids, host.data());
    EXPECT_EQ(be->first_outside(ids, 0, 9), 21) << be->name();
    EXPECT_EQ(be->first_outside(ids, -1, 10), -1) << be->name();
    EXPECT_EQ(be->first_outside(ids, 0, 10), 30) << be->name();
  }
}

TEST_F(DeviceOps, AdamW) {
  const Shape s{1000};
  Op op{"adamw_update",
        {{s, Init::normal, false},
         {s, Init::normal, false},
         {s, Init::normal, false, 0, {}, 0.1f},
         {s, Init::positive, false}},
        {0, 2, 3},
        [](Backend& be, const std::vector<Tensor>& t) {
          AdamWArgs a;
          a.lr = 1e-2f, a.weight_decay = 0.1f, a.grad_scale = 0.5f, a.step = 3;
          be.adamw_update(t[0], Tensor{}, t[1], t[2], t[3], Tensor{}, a);
        }};
  check(op);
  // One pass over a flat buffer as AdamW::step issues it: no-decay ranges (aligned to groups
  // of 4 and not), the compute copy in the activations' dtype, the device control tensor
  // (clip factor; a skipped step changes nothing).
  for (const float apply : {1.0f, 0.0f}) {
    Op flat{"adamw_update, one pass",
            {{s, Init::normal, false},
             {s, Init::normal, false},
             {s, Init::normal, false, 0, {}, 0.1f},
             {s, Init::positive, false},
             {s, Init::zeros, true},
             {{kStepControlSize}, Init::zeros, false}},
            {0, 2, 3, 4},
            [apply](Backend& be, const std::vector<Tensor>& t) {
              const float control[kStepControlSize] = {0.5f, apply};
              be.from_host(t[5], control);
              static const ElementRange gaps[] = {{0, 16}, {100, 60}, {401, 3}, {996, 4}};
              AdamWArgs a;
              a.lr = 1e-2f, a.weight_decay = 0.1f, a.step = 3, a.no_decay = gaps;
              be.adamw_update(t[0], t[4], t[1], t[2], t[3], t[5], a);
            }};
    check(flat);
  }
}

// The step's scalars on the device against the host backends' (which are exactly what the host
// used to compute from sum and sum_squares).
TEST_F(DeviceOps, DeviceScalars) {
  const int64_t n = N * 300 + 13;
  Op op{"scalars", {{{n}}}, {}, nullptr};
  const HostData in = make_inputs(op, 5);
  const SumRange ranges[] = {{0, 1000, 1}, {1000, 2001, 0}, {5000, 64, 1}, {6000, n - 6000, 0}};
  double got[5], want[5];
  for (Backend* be : {target.get(), oracle.get()}) {
    Arena arena(MemoryTag::workspace, *be);
    Tensor x = arena.alloc({n});
    stage_in(*be, x, in.values[0]);
    Tensor sums = arena.alloc({2}, DType::f64), acc = arena.alloc({1}, DType::f64),
           control = arena.alloc({kStepControlSize}), f = arena.alloc({1});
    be->sum_squares_ranges(sums, x, ranges);
    be->fill_zero(acc);
    be->accumulate_mean(acc, x);
    be->accumulate_mean(acc, x);
    be->scalar_add(acc, acc, sums.view(0, {1}));
    be->scalar_divide(acc, acc, 3.0);
    be->copy(f, acc);  // f64 → f32 → f64, as through a communicator
    be->copy(acc, f);
    be->scalar_sqrt(acc, acc);
    be->clip_and_check(control, acc, sums.view(1, {1}), 1.0);
    double* out = be == target.get() ? got : want;
    be->to_host(out, sums);
    be->to_host(out + 2, acc);
    float c[kStepControlSize];
    be->to_host(c, control);
    out[3] = c[kControlScale], out[4] = c[kControlApply];
  }
  for (int i = 0; i < 5; ++i) EXPECT_NEAR(got[i], want[i], 1e-12 * std::abs(want[i])) << i;
}

// ---------------------------------------------------------------------------------------
// Finite differences on the backend under test, in f32: for a random direction v of the
// inputs and random weights w of the outputs, the backward kernels' <dL/dx, v> must match
// (L(x + εv) - L(x - εv)) / 2ε with L = <w, forward(x)>.

class DeviceGradcheck : public DeviceOps {
 protected:
  // forward(be, inputs) → outputs (host); backward(be, inputs, w) → gradient of each input.
  using Forward =
      std::function<std::vector<float>(Backend&, const std::vector<std::vector<float>>&)>;
  using Backward = std::function<std::vector<std::vector<float>>(
      Backend&, const std::vector<std::vector<float>>&, const std::vector<float>&)>;

  void gradcheck(const std::string& name, std::vector<std::vector<float>> x, Forward f, Backward b,
                 float eps = 1e-2f, double tol = 2e-2) {
    SCOPED_TRACE(name + " on " + g_backend);
    std::mt19937 rng(99);
    std::normal_distribution<float> normal;
    std::vector<float> w = f(*target, x);
    for (float& v : w) v = normal(rng);
    std::vector<std::vector<float>> dir = x;
    for (auto& d : dir)
      for (float& v : d) v = normal(rng);
    const auto grads = b(*target, x, w);
    double analytic = 0.0;
    for (size_t i = 0; i < x.size(); ++i)
      for (size_t j = 0; j < x[i].size(); ++j) analytic += double(grads[i][j]) * dir[i][j];
    auto loss = [&](float sign) {
      auto xs = x;
      for (size_t i = 0; i < xs.size(); ++i)
        for (size_t j = 0; j < xs[i].size(); ++j) xs[i][j] += sign * eps * dir[i][j];
      const auto y = f(*target, xs);
      double l = 0.0;
      for (size_t j = 0; j < y.size(); ++j) l += double(w[j]) * y[j];
      return l;
    };
    const double numeric = (loss(1.0f) - loss(-1.0f)) / (2.0 * eps);
    EXPECT_NEAR(analytic, numeric, tol * std::max(1.0, std::abs(numeric)))
        << "analytic " << analytic << " vs finite differences " << numeric;
  }

  static std::vector<float> randn(size_t n, uint32_t seed, float stddev = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, stddev);
    std::vector<float> v(n);
    for (float& x : v) x = normal(rng);
    return v;
  }
  static Tensor put(Backend& be, Arena& arena, Shape s, const std::vector<float>& v) {
    Tensor t = arena.alloc(s);
    be.from_host(t, v.data());
    return t;
  }
  static std::vector<float> get(Backend& be, Tensor t) { return stage_out(be, t); }
};

TEST_F(DeviceGradcheck, RmsnormAndLayernorm) {
  const Shape s{5, 24};
  gradcheck(
      "rmsnorm", {randn(120, 1), randn(24, 2)},
      [&](Backend& be, const auto& x) {
        Arena a(MemoryTag::workspace, be);
        Tensor out = a.alloc(s), rstd = a.alloc({5});
        be.rmsnorm_forward(out, rstd, put(be, a, s, x[0]), put(be, a, {24}, x[1]), 1e-5f);
        return get(be, out);
      },
      [&](Backend& be, const auto& x, const std::vector<float>& w) {
        Arena a(MemoryTag::workspace, be);
        Tensor xs = put(be, a, s, x[0]), wt = put(be, a, {24}, x[1]);
        Tensor out = a.alloc(s), rstd = a.alloc({5}), dx = a.alloc(s), dw = a.alloc({24});
        be.rmsnorm_forward(out, rstd, xs, wt, 1e-5f);
        be.rmsnorm_backward(dx, dw, put(be, a, s, w), xs, wt, rstd);
        return std::vector<std::vector<float>>{get(be, dx), get(be, dw)};
      });
  gradcheck(
      "layernorm", {randn(120, 3), randn(24, 4), randn(24, 5)},
      [&](Backend& be, const auto& x) {
        Arena a(MemoryTag::workspace, be);
        Tensor out = a.alloc(s), mean = a.alloc({5}), rstd = a.alloc({5});
        be.layernorm_forward(out, mean, rstd, put(be, a, s, x[0]), put(be, a, {24}, x[1]),
                             put(be, a, {24}, x[2]), 1e-5f);
        return get(be, out);
      },
      [&](Backend& be, const auto& x, const std::vector<float>& w) {
        Arena a(MemoryTag::workspace, be);
        Tensor xs = put(be, a, s, x[0]), wt = put(be, a, {24}, x[1]), bs = put(be, a, {24}, x[2]);
        Tensor out = a.alloc(s), mean = a.alloc({5}), rstd = a.alloc({5});
        Tensor dx = a.alloc(s), dw = a.alloc({24}), db = a.alloc({24});
        be.layernorm_forward(out, mean, rstd, xs, wt, bs, 1e-5f);
        be.layernorm_backward(dx, dw, db, put(be, a, s, w), xs, wt, mean, rstd);
        return std::vector<std::vector<float>>{get(be, dx), get(be, dw), get(be, db)};
      });
}

TEST_F(DeviceGradcheck, Attention) {
  const Shape qs{1, 21, 4, 16}, ks{1, 21, 2, 16};
  gradcheck(
      "attention", {randn(qs.numel(), 6), randn(ks.numel(), 7), randn(ks.numel(), 8)},
      [&](Backend& be, const auto& x) {
        Arena a(MemoryTag::workspace, be);
        Tensor out = a.alloc(qs), lse = a.alloc({1, 4, 21});
        be.attention_forward(out, lse, put(be, a, qs, x[0]), put(be, a, ks, x[1]),
                             put(be, a, ks, x[2]));
        return get(be, out);
      },
      [&](Backend& be, const auto& x, const std::vector<float>& w) {
        Arena a(MemoryTag::workspace, be);
        Tensor q = put(be, a, qs, x[0]), k = put(be, a, ks, x[1]), v = put(be, a, ks, x[2]);
        Tensor out = a.alloc(qs), lse = a.alloc({1, 4, 21});
        Tensor dq = a.alloc(qs), dk = a.alloc(ks), dv = a.alloc(ks);
        be.attention_forward(out, lse, q, k, v);
        be.attention_backward(dq, dk, dv, put(be, a, qs, w), out, lse, q, k, v);
        return std::vector<std::vector<float>>{get(be, dq), get(be, dk), get(be, dv)};
      });
}

TEST_F(DeviceGradcheck, SwigluAndCrossEntropy) {
  const Shape s{6, 20};
  gradcheck(
      "swiglu", {randn(120, 9), randn(120, 10)},
      [&](Backend& be, const auto& x) {
        Arena a(MemoryTag::workspace, be);
        Tensor out = a.alloc(s);
        be.swiglu_forward(out, put(be, a, s, x[0]), put(be, a, s, x[1]), true);
        return get(be, out);
      },
      [&](Backend& be, const auto& x, const std::vector<float>& w) {
        Arena a(MemoryTag::workspace, be);
        Tensor dg = a.alloc(s), du = a.alloc(s);
        be.swiglu_backward(dg, du, put(be, a, s, w), put(be, a, s, x[0]), put(be, a, s, x[1]),
                           true);
        return std::vector<std::vector<float>>{get(be, dg), get(be, du)};
      });
  // The loss of each row against fixed targets, as a function of the logits.
  const std::vector<int32_t> targets{3, 0, 19, 7, 7, 12};
  gradcheck(
      "cross_entropy", {randn(120, 11, 2.0f)},
      [&](Backend& be, const auto& x) {
        Arena a(MemoryTag::workspace, be);
        Tensor tg = a.alloc({6}, DType::i32), losses = a.alloc({6}), probs = a.alloc(s);
        be.from_host(tg, targets.data());
        be.cross_entropy_forward(losses, probs, put(be, a, s, x[0]), tg);
        return get(be, losses);
      },
      [&](Backend& be, const auto& x, const std::vector<float>& w) {
        // d Σ_r w_r loss_r / d logits = w_r (p - onehot): scale_rows applies w per row.
        Arena a(MemoryTag::workspace, be);
        Tensor tg = a.alloc({6}, DType::i32), losses = a.alloc({6}), probs = a.alloc(s);
        be.from_host(tg, targets.data());
        be.cross_entropy_forward(losses, probs, put(be, a, s, x[0]), tg);
        Tensor d = a.alloc(s);
        be.cross_entropy_backward(d, probs, tg, 1.0f);
        be.scale_rows(d, d, put(be, a, {6}, w));
        return std::vector<std::vector<float>>{get(be, d)};
      });
}

}  // namespace
}  // namespace bottle

int main(int argc, char** argv) {
  return bottle::testing::run_on_backend(argc, argv, bottle::g_backend);
}
