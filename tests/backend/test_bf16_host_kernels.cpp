// The cpu backend's bf16 kernels (src/backend/cpu/): every op a training step runs, and the
// rest of backend.h, on bf16 tensors (and on a mix of bf16 and fp32 operands), run three ways
// on the same inputs:
//  - `cpu`: the native kernels, which read bf16, compute in fp32 and round once;
//  - `cpu-widened`: the same fp32 kernels behind the widening backend (whole tensors widened
//    to fp32 scratch, outputs rounded afterwards), as bf16 ran before: the native kernels
//    must store exactly its bits;
//  - `reference` (widened, naive loops summing in double): the oracle. Each bf16 output
//    element lies within one bf16 ulp of it, plus the fp32 kernels' own tolerance (1e-5 of
//    the output's largest magnitude, test_backend_ops.cpp's), since the cpu kernels sum in
//    fp32 in another order before the one rounding.
// Shapes cross the kernels' blocking: elementwise tiles (2048 elements), attention's query
// blocks (128 rows) with GQA, odd widths.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/arena.h"
#include "backend/backend.h"
#include "core/bf16.h"

namespace bottle {
namespace {

struct Spec {
  Shape shape;
  DType dtype = DType::bf16;
  enum Fill { normal, positive, ids } fill = normal;
  int32_t vocab = 0;  // ids in [0, vocab)
  float scale = 1.0f;
};

Spec bf(Shape s, float scale = 1.0f) { return {s, DType::bf16, Spec::normal, 0, scale}; }
Spec f32(Shape s, float scale = 1.0f) { return {s, DType::f32, Spec::normal, 0, scale}; }
Spec pos(Shape s, DType t = DType::f32) { return {s, t, Spec::positive, 0, 1.0f}; }
Spec tok(Shape s, int32_t vocab) { return {s, DType::i32, Spec::ids, vocab, 1.0f}; }

using KernelRun = std::function<void(Backend&, const std::vector<Tensor>&)>;

class Bf16HostKernels : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> native = make_backend("cpu");
  std::unique_ptr<Backend> widened = make_backend("cpu-widened");
  std::unique_ptr<Backend> reference = make_backend("reference");
  Arena arena{MemoryTag::workspace};
  std::mt19937 rng{30};

  std::vector<Tensor> make(const std::vector<Spec>& specs) {
    std::vector<Tensor> ts;
    for (const Spec& s : specs) {
      Tensor t = arena.alloc(s.shape, s.dtype);
      std::normal_distribution<float> normal(0.0f, s.scale);
      std::uniform_real_distribution<float> positive(0.5f, 2.0f);
      std::uniform_int_distribution<int32_t> id(0, std::max(s.vocab - 1, 0));
      for (int64_t i = 0; i < t.numel(); ++i) {
        if (s.dtype == DType::i32) {
          t.i32()[i] = id(rng);
          continue;
        }
        const float x = s.fill == Spec::positive ? positive(rng) : normal(rng);
        if (s.dtype == DType::bf16)
          t.bf16()[i] = bf16_from_float(x);
        else
          t.f32()[i] = x;
      }
      ts.push_back(t);
    }
    return ts;
  }
  std::vector<Tensor> clone(const std::vector<Tensor>& ts) {
    std::vector<Tensor> out;
    for (const Tensor& t : ts) {
      Tensor c = arena.alloc(t.shape, t.dtype);
      std::memcpy(c.data, t.data, t.nbytes());
      out.push_back(c);
    }
    return out;
  }

  static float value(const Tensor& t, int64_t i) {
    return t.dtype == DType::bf16 ? bf16_to_float(t.bf16()[i]) : t.f32()[i];
  }

  // Runs `run` on each backend from the same tensors and compares every tensor afterwards;
  // `prepare`, if given, first fills some of them on the reference (inputs that must agree
  // with each other, as a forward's saved outputs do), the same for all three.
  void check(const std::string& what, const std::vector<Spec>& specs, const KernelRun& run,
             const KernelRun& prepare = {}, bool oracle = true) {
    SCOPED_TRACE(what);
    const std::vector<Tensor> inputs = make(specs);
    if (prepare) prepare(*reference, inputs);
    const std::vector<Tensor> a = clone(inputs), b = clone(inputs), r = clone(inputs);
    run(*native, a);
    run(*widened, b);
    run(*reference, r);
    for (size_t k = 0; k < a.size(); ++k) {
      SCOPED_TRACE("tensor " + std::to_string(k) + " " + a[k].shape.str() + " " +
                   dtype_name(a[k].dtype));
      // Bits: the native kernel against the widened one.
      int64_t differ = 0, first = -1;
      const size_t size = dtype_size(a[k].dtype);
      for (int64_t i = 0; i < a[k].numel(); ++i)
        if (std::memcmp(static_cast<char*>(a[k].data) + i * size,
                        static_cast<char*>(b[k].data) + i * size, size) != 0)
          if (differ++ == 0) first = i;
      EXPECT_EQ(differ, 0) << "elements differing from cpu-widened, first at " << first << ": "
                           << (first >= 0 ? value(a[k], first) : 0.0f) << " vs "
                           << (first >= 0 ? value(b[k], first) : 0.0f);
      if (a[k].dtype == DType::i32 || !oracle) continue;
      // Values: within one bf16 ulp (for a bf16 tensor) plus the fp32 tolerance of the oracle.
      double max_ref = 0.0;
      for (int64_t i = 0; i < r[k].numel(); ++i)
        max_ref = std::max(max_ref, std::abs(double(value(r[k], i))));
      int64_t bad = 0, worst = -1;
      for (int64_t i = 0; i < a[k].numel(); ++i) {
        const double got = value(a[k], i), want = value(r[k], i);
        ASSERT_TRUE(std::isfinite(got) && std::isfinite(want))
            << i << ": " << got << " vs " << want;
        const double ulp = a[k].dtype == DType::bf16
                               ? std::ldexp(1.0, std::ilogb(std::max(std::abs(want), 1e-30)) - 7)
                               : 0.0;
        if (std::abs(got - want) > ulp + 1e-5 * max_ref)
          if (bad++ == 0) worst = i;
      }
      EXPECT_EQ(bad, 0) << "elements beyond one bf16 ulp of the reference, first at " << worst
                        << ": " << (worst >= 0 ? value(a[k], worst) : 0.0f) << " vs "
                        << (worst >= 0 ? value(r[k], worst) : 0.0f);
    }
  }
};

// Larger than one 2048-element tile per thread, not a multiple of it.
constexpr int64_t kRows = 37, kCols = 301;

TEST_F(Bf16HostKernels, Elementwise) {
  const Shape s{kRows, kCols};
  check("silu_forward", {bf(s), bf(s)}, [](Backend& be, auto t) { be.silu_forward(t[0], t[1]); });
  check("silu_backward", {bf(s), bf(s), bf(s)},
        [](Backend& be, auto t) { be.silu_backward(t[0], t[1], t[2]); });
  for (bool act : {true, false}) {
    check(act ? "swiglu_forward" : "swiglu_forward identity", {bf(s), bf(s), bf(s)},
          [act](Backend& be, auto t) { be.swiglu_forward(t[0], t[1], t[2], act); });
    check(act ? "swiglu_backward" : "swiglu_backward identity", {bf(s), bf(s), bf(s), bf(s), bf(s)},
          [act](Backend& be, auto t) { be.swiglu_backward(t[0], t[1], t[2], t[3], t[4], act); });
  }
  check("add", {bf(s), bf(s), bf(s)}, [](Backend& be, auto t) { be.add(t[0], t[1], t[2]); });
  check("add, fp32 b", {bf(s), bf(s), f32(s)},
        [](Backend& be, auto t) { be.add(t[0], t[1], t[2]); });
  check("add in place", {bf(s), bf(s)}, [](Backend& be, auto t) { be.add(t[0], t[0], t[1]); });
  check("accumulate", {bf(s), bf(s)}, [](Backend& be, auto t) { be.accumulate(t[0], t[1]); });
  check("accumulate into fp32", {f32(s), bf(s)},
        [](Backend& be, auto t) { be.accumulate(t[0], t[1]); });
  check("scale", {bf(s)}, [](Backend& be, auto t) { be.scale(t[0], 0.37f); });
  check("multiply", {bf(s), bf(s), bf(s)},
        [](Backend& be, auto t) { be.multiply(t[0], t[1], t[2]); });
  check("divide", {bf(s), bf(s), pos(s, DType::bf16)},
        [](Backend& be, auto t) { be.divide(t[0], t[1], t[2]); });
  check("fill_zero", {bf(s)}, [](Backend& be, auto t) { be.fill_zero(t[0]); });
  check("copy to bf16", {bf(s), f32(s)}, [](Backend& be, auto t) { be.copy(t[0], t[1]); });
  check("copy to fp32", {f32(s), bf(s)}, [](Backend& be, auto t) { be.copy(t[0], t[1]); });
  check("copy_columns to bf16", {bf({kRows, 40}), f32({kRows, 30})},
        [](Backend& be, auto t) { be.copy_columns(t[0], 7, t[1], 3, 20); });
  check("copy_columns to fp32", {f32({kRows, 40}), bf({kRows, 30})},
        [](Backend& be, auto t) { be.copy_columns(t[0], 7, t[1], 3, 20); });
}

TEST_F(Bf16HostKernels, Reductions) {
  const std::vector<Tensor> ts = make({bf({3, 70001})});
  for (const auto& [name, f] : std::vector<std::pair<const char*, double (Backend::*)(Tensor)>>{
           {"sum_squares", &Backend::sum_squares}, {"sum", &Backend::sum}}) {
    const double a = ((*native).*f)(ts[0]), b = ((*widened).*f)(ts[0]),
                 r = ((*reference).*f)(ts[0]);
    EXPECT_EQ(a, b) << name;  // the same double, bit for bit
    EXPECT_NEAR(a, r, 1e-9 * std::abs(r) + 1e-9) << name;
  }
}

TEST_F(Bf16HostKernels, Norms) {
  const Shape s{kRows, kCols}, w{kCols}, r{kRows};
  check("rmsnorm_forward", {bf(s), f32(r), bf(s), f32(w)},
        [](Backend& be, auto t) { be.rmsnorm_forward(t[0], t[1], t[2], t[3], 1e-5f); });
  check("rmsnorm_forward, bf16 weight", {bf(s), f32(r), bf(s), bf(w)},
        [](Backend& be, auto t) { be.rmsnorm_forward(t[0], t[1], t[2], t[3], 1e-5f); });
  check("residual_rmsnorm_forward", {bf(s), bf(s), f32(r), bf(s), bf(s), f32(w)},
        [](Backend& be, auto t) {
          be.residual_rmsnorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], 1e-5f);
        });
  check("rmsnorm_backward", {bf(s), f32(w), bf(s), bf(s), f32(w), pos(r)},
        [](Backend& be, auto t) { be.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]); });
  check("rmsnorm_backward, bf16 dweight", {bf(s), bf(w), bf(s), bf(s), f32(w), pos(r)},
        [](Backend& be, auto t) { be.rmsnorm_backward(t[0], t[1], t[2], t[3], t[4], t[5]); });
  check("rmsnorm_shard_forward", {bf(s), f32(r), bf(s), f32(w)},
        [](Backend& be, auto t) { be.rmsnorm_shard_forward(t[0], t[1], t[2], t[3], 1e-5f); });
  check("rmsnorm_shard_backward", {bf(s), f32(w), bf(s), bf(s), f32(w), pos(r), f32(r)},
        [](Backend& be, auto t) {
          be.rmsnorm_shard_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], 2 * kCols);
        });
  check(
      "layernorm_forward", {bf(s), f32(r), f32(r), bf(s), f32(w), f32(w)},
      [](Backend& be, auto t) { be.layernorm_forward(t[0], t[1], t[2], t[3], t[4], t[5], 1e-5f); });
  check("layernorm_backward", {bf(s), f32(w), f32(w), bf(s), bf(s), f32(w), f32(r, 0.1f), pos(r)},
        [](Backend& be, auto t) {
          be.layernorm_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7]);
        });
  check("rms_from_sum_squares", {f32(r), pos(r)},
        [](Backend& be, auto t) { be.rms_from_sum_squares(t[0], t[1], 301.0f, 1e-5f, true); });
  check("scale_rows", {bf(s), bf(s), f32(r)},
        [](Backend& be, auto t) { be.scale_rows(t[0], t[1], t[2]); });
  check("row_dot", {f32(r), bf(s), bf(s)},
        [](Backend& be, auto t) { be.row_dot(t[0], t[1], t[2]); });
}

TEST_F(Bf16HostKernels, Rope) {
  const Shape s{2, 9, 3, 16}, sk{2, 9, 1, 16};
  check("rope_forward", {bf(s), bf(sk)},
        [](Backend& be, auto t) { be.rope_forward(t[0], t[1], 10000.0f); });
  check("rope_backward", {bf(s), bf(sk)},
        [](Backend& be, auto t) { be.rope_backward(t[0], t[1], 10000.0f); });
}

// Two query blocks (S = 200 > 128), GQA with two query heads per kv head.
TEST_F(Bf16HostKernels, Attention) {
  const Shape q{2, 200, 4, 16}, kv{2, 200, 2, 16}, lse{2, 4, 200};
  check("attention_forward", {bf(q), f32(lse), bf(q), bf(kv), bf(kv)},
        [](Backend& be, auto t) { be.attention_forward(t[0], t[1], t[2], t[3], t[4]); });
  // Backward from out and lse of the forward (the saved activations of a step), the same
  // for the three backends: the reference's. The cpu kernel takes rowsum(dO ⊙ O) from the
  // saved out, as flash attention does, where the reference sums Σ P dP exactly; with a bf16
  // out the two differ by out's rounding (0.4 %), so the oracle is held to one ulp with an
  // fp32 out, and a bf16 out to the widened kernel's bits only.
  const auto backward = [](Backend& be, auto t) {
    be.attention_backward(t[0], t[1], t[2], t[3], t[4], t[5], t[6], t[7], t[8]);
  };
  const auto forward = [](Backend& be, auto t) {
    be.attention_forward(t[4], t[5], t[6], t[7], t[8]);
  };
  check("attention_backward, fp32 out",
        {bf(q), bf(kv), bf(kv), bf(q), f32(q), f32(lse), bf(q), bf(kv), bf(kv)}, backward, forward);
  check("attention_backward",
        {bf(q), bf(kv), bf(kv), bf(q), bf(q), f32(lse), bf(q), bf(kv), bf(kv)}, backward, forward,
        false);
}

TEST_F(Bf16HostKernels, CrossEntropy) {
  const int64_t n = 23, v = 517;
  const Shape l{n, v}, r{n};
  check("cross_entropy_forward and backward", {f32(r), bf(l), bf(l, 3.0f), tok(r, v), bf(l)},
        [](Backend& be, auto t) {
          be.cross_entropy_forward(t[0], t[1], t[2], t[3]);
          be.cross_entropy_backward(t[4], t[1], t[3], 0.125f);
        });
  // A shard of the vocabulary starting at 200: some targets fall outside it.
  check("vocabulary-parallel cross-entropy",
        {f32(r), f32(r), bf(l, 3.0f), tok(r, 1000), bf(l), f32(r), f32(r), f32(r)},
        [](Backend& be, auto t) {
          be.logits_row_stats(t[0], t[1], t[2]);
          be.cross_entropy_shard_backward(t[4], t[2], t[0], t[1], t[3], 200, 0.125f);
          be.cross_entropy_shard_partials(t[5], t[6], t[1], t[0], t[0], t[2], t[3], 200);
          be.cross_entropy_shard_losses(t[7], t[5], t[6], t[0]);
        });
}

TEST_F(Bf16HostKernels, Embedding) {
  const int64_t n = 41, c = 67, vocab = 50;
  check("embedding_forward", {bf({n, c}), tok({n}, vocab), bf({vocab, c})},
        [](Backend& be, auto t) { be.embedding_forward(t[0], t[1], t[2]); });
  check("embedding_forward, fp32 table", {bf({n, c}), tok({n}, vocab), f32({vocab, c})},
        [](Backend& be, auto t) { be.embedding_forward(t[0], t[1], t[2]); });
  check("embedding_backward", {f32({vocab, c}), tok({n}, vocab), bf({n, c})},
        [](Backend& be, auto t) { be.embedding_backward(t[0], t[1], t[2]); });
  check("embedding_backward, bf16 table", {bf({vocab, c}), tok({n}, vocab), bf({n, c})},
        [](Backend& be, auto t) { be.embedding_backward(t[0], t[1], t[2]); });
  check("embedding_shard_forward", {bf({n, c}), tok({n}, 2 * vocab), bf({vocab, c})},
        [](Backend& be, auto t) { be.embedding_shard_forward(t[0], t[1], t[2], 30); });
  check("embedding_shard_backward", {f32({vocab, c}), tok({n}, 2 * vocab), bf({n, c})},
        [](Backend& be, auto t) { be.embedding_shard_backward(t[0], t[1], t[2], 30); });
}

// bf16 products: natively on oneDNN's bf16 matmul where the CPU has one, else widened; an
// fp32 or bf16 C, accumulated into or overwritten.
TEST_F(Bf16HostKernels, Gemm) {
  for (const DType c_dtype : {DType::f32, DType::bf16})
    for (const float beta : {0.0f, 1.0f}) {
      const Spec c = c_dtype == DType::bf16 ? bf({3, 33, 45}) : f32({3, 33, 45});
      check(std::string("gemm, C ") + dtype_name(c_dtype) + (beta != 0.0f ? " +=" : ""),
            {bf({3, 70, 33}), bf({45, 70}), c}, [beta](Backend& be, auto t) {
              GemmArgs g;
              g.trans_a = true, g.trans_b = true;
              g.m = 33, g.n = 45, g.k = 70, g.batch = 3;
              g.alpha = 0.5f, g.beta = beta;
              g.a = t[0].data, g.lda = 33, g.stride_a = 70 * 33;
              g.b = t[1].data, g.ldb = 70, g.stride_b = 0;
              g.c = t[2].data, g.ldc = 45, g.stride_c = 33 * 45;
              g.dtypes_of(t[0], t[1], t[2]);
              be.gemm(g);
            });
    }
}

TEST_F(Bf16HostKernels, AdamWRefreshesTheBf16Copy) {
  const Shape s{5000};
  check("adamw_update", {f32(s), bf(s), f32(s), f32(s), pos(s)}, [](Backend& be, auto t) {
    AdamWArgs a;
    a.lr = 1e-2f, a.weight_decay = 0.1f, a.step = 3;
    be.adamw_update(t[0], t[1], t[2], t[3], t[4], Tensor{}, a);
  });
}

TEST_F(Bf16HostKernels, NativeBackendTakesBf16Itself) {
  EXPECT_EQ(native->bf16_unsupported(), "");
  EXPECT_NE(native->bf16_gemm_path(), "none");
}

}  // namespace
}  // namespace bottle
