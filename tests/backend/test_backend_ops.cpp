// What the op table (test_device_ops.cpp: every Backend op on every backend present against
// `reference`) cannot show, on the host backends `cpu` and `reference`: identities between
// ops (a whole-row shard backward, the vocabulary-parallel loss from its pieces, one-pass AdamW
// as the per-parameter updates), aliasing, reductions in index order, the reference against
// formulas and, element by element, against finite differences of its own forward kernels,
// allocation and staging, the operand checks of backend.cpp, and the bf16 widening contract.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "core/arena.h"
#include "backend/backend.h"
#include "core/bf16.h"
#include "backend/counting_backend.h"
#include "backend/cpu_backend.h"
#include "backend/gemm_peak.h"
#include "backend/reference_backend.h"

namespace bottle {
namespace {

constexpr double kMaxNmse = 1e-10;
constexpr double kMaxRelAbs = 1e-5;
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// got vs want (the reference): normalised MSE and max abs error relative to max |want|.
::testing::AssertionResult all_close(const float* got, const float* want, int64_t n,
                                     double max_nmse = kMaxNmse, double max_rel = kMaxRelAbs) {
  double err2 = 0.0, ref2 = 0.0, max_err = 0.0, max_ref = 0.0;
  int64_t worst = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) {
      return ::testing::AssertionFailure()
             << "non-finite value at " << i << ": got " << got[i] << ", want " << want[i];
    }
    const double d = double(got[i]) - double(want[i]);
    err2 += d * d;
    ref2 += double(want[i]) * want[i];
    if (std::abs(d) > max_err) max_err = std::abs(d), worst = i;
    max_ref = std::max(max_ref, std::abs(double(want[i])));
  }
  const double nmse = ref2 > 0 ? err2 / ref2 : (err2 > 0 ? INFINITY : 0.0);
  const double rel = max_ref > 0 ? max_err / max_ref : (max_err > 0 ? INFINITY : 0.0);
  if (nmse <= max_nmse && rel <= max_rel) return ::testing::AssertionSuccess();
  auto f = ::testing::AssertionFailure();
  f << "nmse " << nmse << " (max " << max_nmse << "), max abs err " << max_err << " / max |ref| "
    << max_ref << " = " << rel << " (max " << max_rel << ")";
  if (worst >= 0) f << "; worst at " << worst << ": got " << got[worst] << ", want " << want[worst];
  return f;
}

::testing::AssertionResult all_close(const Tensor& got, const Tensor& want) {
  if (!(got.shape == want.shape)) {
    return ::testing::AssertionFailure()
           << "shape " << got.shape.str() << " vs " << want.shape.str();
  }
  return all_close(got.f32(), want.f32(), got.numel());
}

class BackendOps : public ::testing::Test {
 protected:
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  std::unique_ptr<Backend> ref = make_reference_backend();
  Arena arena{MemoryTag::workspace};
  std::mt19937 rng{1234};

  Tensor randn(Shape s, float stddev = 1.0f, float mean = 0.0f) {
    Tensor t = arena.alloc(s);
    std::normal_distribution<float> dist(mean, stddev);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
    return t;
  }
  Tensor uniform(Shape s, float lo, float hi) {
    Tensor t = arena.alloc(s);
    std::uniform_real_distribution<float> dist(lo, hi);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
    return t;
  }
  Tensor full(Shape s, float value) {
    Tensor t = arena.alloc(s);
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = value;
    return t;
  }
  Tensor nans(Shape s) { return full(s, kNaN); }
  Tensor ids(Shape s, int32_t vocab) {
    Tensor t = arena.alloc(s, DType::i32);
    std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
    for (int64_t i = 0; i < t.numel(); ++i) t.i32()[i] = dist(rng);
    return t;
  }
  Tensor clone(const Tensor& src) {
    Tensor t = arena.alloc(src.shape, src.dtype);
    std::copy_n(static_cast<const char*>(src.data), src.nbytes(), static_cast<char*>(t.data));
    return t;
  }
};

// ---------------------------------------------------------------------------------------
// Identities between ops, on both host backends. Each op against the reference is an entry of
// the op table (test_device_ops.cpp); here, what no comparison with the reference can show.

// rmsnorm_shard_backward with the slice being the whole row (d = C, dot from the row) is
// rmsnorm_backward.
TEST_F(BackendOps, RmsnormShardBackwardOfTheWholeRowIsRmsnormBackward) {
  const int64_t N = 37, C = 24;
  Tensor x = randn({N, C}, 2.0f, 0.3f), w = randn({C}, 0.5f, 1.0f), dout = randn({N, C});
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    Tensor rstd = nans({N}), out = nans({N, C}), dot = nans({N}), wdout = nans({N, C});
    be->rmsnorm_forward(out, rstd, x, w, 1e-5f);
    for (int64_t i = 0; i < N * C; ++i) wdout.f32()[i] = dout.f32()[i] * w.f32()[i % C];
    be->row_dot(dot, wdout, x);
    Tensor dx0 = randn({N, C}), dw0 = randn({C});
    Tensor dx_whole = clone(dx0), dw_whole = clone(dw0), dx_shard = clone(dx0),
           dw_shard = clone(dw0);
    be->rmsnorm_backward(dx_whole, dw_whole, dout, x, w, rstd);
    be->rmsnorm_shard_backward(dx_shard, dw_shard, dout, x, w, rstd, dot, C);
    EXPECT_TRUE(all_close(dx_shard, dx_whole));
    EXPECT_TRUE(all_close(dw_shard, dw_whole));
  }
}

// Outputs that alias an input (backend.h: add, multiply, divide, scale_rows) give the bits the
// same op gives into a separate output.
TEST_F(BackendOps, OutputsMayAliasInputs) {
  const int64_t N = 37, C = 24;
  Tensor a = randn({N, C}), b = uniform({N, C}, 0.5f, 2.0f), f = randn({N});
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    using Op = std::function<void(Tensor out, Tensor x, Tensor y)>;
    const std::pair<const char*, Op> ops[] = {
        {"add", [&](Tensor o, Tensor x, Tensor y) { be->add(o, x, y); }},
        {"multiply", [&](Tensor o, Tensor x, Tensor y) { be->multiply(o, x, y); }},
        {"divide", [&](Tensor o, Tensor x, Tensor y) { be->divide(o, x, y); }},
    };
    for (const auto& [name, op] : ops) {
      SCOPED_TRACE(name);
      Tensor separate = nans({N, C}), into_a = clone(a), into_b = clone(b);
      op(separate, a, b);
      op(into_a, into_a, b);
      op(into_b, a, into_b);
      EXPECT_TRUE(all_close(into_a.f32(), separate.f32(), separate.numel(), 0.0, 0.0));
      EXPECT_TRUE(all_close(into_b.f32(), separate.f32(), separate.numel(), 0.0, 0.0));
    }
    Tensor separate = nans({N, C}), in_place = clone(a);
    be->scale_rows(separate, a, f);
    be->scale_rows(in_place, in_place, f);
    EXPECT_TRUE(all_close(in_place.f32(), separate.f32(), separate.numel(), 0.0, 0.0))
        << "scale_rows";
  }
}

// The scalar reductions are accumulated in double in index order on every host backend: the
// same bits whatever the thread count (losses and gradient norms decide clipping and skips).
// The reference's sum of squares is the exact one, and its RMS the formula's.
TEST_F(BackendOps, ReductionsAreInIndexOrder) {
  for (int64_t n : {1, 37, 37 * 24, 100003}) {
    SCOPED_TRACE(::testing::Message() << "n=" << n);
    Tensor x = randn({n}, 1.7f);
    double sum = 0.0, sumsq = 0.0;
    for (int64_t i = 0; i < n; ++i) sum += x.f32()[i], sumsq += double(x.f32()[i]) * x.f32()[i];
    EXPECT_EQ(cpu->sum(x), sum);
    EXPECT_EQ(ref->sum(x), sum);
    EXPECT_NEAR(ref->sum_squares(x), sumsq, 1e-12 * sumsq);
  }
  Tensor sumsq = uniform({37}, 0.0f, 50.0f);
  for (bool reciprocal : {false, true}) {
    Tensor r = full({37}, kNaN);
    ref->rms_from_sum_squares(r, sumsq, 12.0f, 1e-5f, reciprocal);
    const float want = std::sqrt(sumsq.f32()[3] / 12.0f + 1e-5f);
    EXPECT_FLOAT_EQ(r.f32()[3], reciprocal ? 1.0f / want : want);
  }
}

// ---------------------------------------------------------------------------------------
// The reference against formulas: RoPE's rotation, attention's softmax statistic.

TEST_F(BackendOps, RopeMatchesFormula) {
  const int64_t B = 1, S = 5, Hh = 2, Hkv = 1, hd = 6;
  const float theta = 10000.0f;
  // q with Hh heads and k with Hkv (GQA), rotated in one call.
  Tensor x = randn({B, S, Hh, hd}), y = clone(x), xk = randn({B, S, Hkv, hd}), yk = clone(xk);
  ref->rope_forward(y, yk, theta);
  for (const auto& [in, out, heads] : {std::tuple{&x, &y, Hh}, std::tuple{&xk, &yk, Hkv}})
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t i = 0; i < hd / 2; ++i) {
          const double angle = double(s) * std::pow(double(theta), -2.0 * double(i) / hd);
          const float* xv = in->f32() + (s * heads + h) * hd;
          const float* yv = out->f32() + (s * heads + h) * hd;
          EXPECT_NEAR(yv[i], xv[i] * std::cos(angle) - xv[i + hd / 2] * std::sin(angle), 1e-6);
          EXPECT_NEAR(yv[i + hd / 2], xv[i + hd / 2] * std::cos(angle) + xv[i] * std::sin(angle),
                      1e-6);
        }
  // Backward is the inverse rotation.
  for (Backend* be : {ref.get(), cpu.get()}) {
    SCOPED_TRACE(be->name());
    Tensor z = clone(x), zk = clone(xk);
    be->rope_forward(z, zk, theta);
    be->rope_backward(z, zk, theta);
    EXPECT_TRUE(all_close(z.f32(), x.f32(), x.numel(), 1e-12, 1e-6));
    EXPECT_TRUE(all_close(zk.f32(), xk.f32(), xk.numel(), 1e-12, 1e-6));
  }
}

struct AttnCase {
  int64_t B, S, H, Hkv, hd;
};
// The long cases exercise the cpu backend's causal query blocks of 64 (S = 128: 2 blocks,
// S = 192: 3 blocks, S = 256: 4 blocks with a realistic head size).
const AttnCase kAttnCases[] = {{2, 7, 4, 2, 8},   {2, 7, 4, 4, 8},   {1, 9, 4, 1, 6},
                               {3, 5, 6, 3, 4},   {1, 128, 4, 2, 8}, {2, 192, 2, 1, 4},
                               {1, 256, 8, 2, 32}};

// score_ij = q_i . k_j / sqrt(hd) in double, computed independently of either backend.
double attn_score(const AttnCase& c, const Tensor& q, const Tensor& k, int64_t b, int64_t h,
                  int64_t i, int64_t j) {
  const float* qi = q.f32() + ((b * c.S + i) * c.H + h) * c.hd;
  const float* kj = k.f32() + ((b * c.S + j) * c.Hkv + h / (c.H / c.Hkv)) * c.hd;
  double s = 0.0;
  for (int64_t e = 0; e < c.hd; ++e) s += double(qi[e]) * kj[e];
  return s / std::sqrt(double(c.hd));
}

// lse is finite, max_j score_ij <= lse_i <= max + log(i + 1), and the probabilities it implies
// over the causal row sum to 1, on both host backends: the statistic backward recomputes the
// probabilities from, checked against scores computed here in double.
TEST_F(BackendOps, AttentionLseIsTheSoftmaxStatistic) {
  for (const AttnCase& c : kAttnCases) {
    SCOPED_TRACE(::testing::Message() << "B=" << c.B << " S=" << c.S << " H=" << c.H
                                      << " Hkv=" << c.Hkv << " hd=" << c.hd);
    Tensor q = randn({c.B, c.S, c.H, c.hd}, 1.5f), k = randn({c.B, c.S, c.Hkv, c.hd}, 1.5f);
    Tensor v = randn({c.B, c.S, c.Hkv, c.hd});
    for (Backend* be : {cpu.get(), ref.get()}) {
      SCOPED_TRACE(be->name());
      Tensor out = nans({c.B, c.S, c.H, c.hd}), lse = nans({c.B, c.H, c.S});
      be->attention_forward(out, lse, q, k, v);
      int failures = 0;
      for (int64_t b = 0; b < c.B; ++b) {
        for (int64_t h = 0; h < c.H; ++h) {
          for (int64_t i = 0; i < c.S && failures < 10; ++i) {
            const double l = lse.f32()[(b * c.H + h) * c.S + i];
            double max_score = -INFINITY, sum = 0.0;
            for (int64_t j = 0; j <= i; ++j)
              max_score = std::max(max_score, attn_score(c, q, k, b, h, i, j));
            for (int64_t j = 0; j <= i; ++j) sum += std::exp(attn_score(c, q, k, b, h, i, j) - l);
            const double tol = 1e-5 * std::max(1.0, std::abs(max_score));
            const bool ok = std::isfinite(l) && l >= max_score - tol &&
                            l <= max_score + std::log(double(i + 1)) + tol &&
                            std::abs(sum - 1.0) <= 1e-5;
            if (!ok) ++failures;
            EXPECT_TRUE(ok) << "b=" << b << " h=" << h << " i=" << i << ": lse " << l
                            << ", max score " << max_score << ", sum exp(score - lse) " << sum;
          }
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------------------
// Memory, staging and copies: allocation, and the refusals of backend.cpp.

TEST_F(BackendOps, AllocateStageAndCopy) {
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    Arena owned(MemoryTag::workspace, *be);
    Tensor a = owned.alloc({5, 7}), b = owned.alloc({35});
    EXPECT_EQ(a.device, be->device());
    for (int64_t i = 0; i < a.numel(); ++i) ASSERT_EQ(a.f32()[i], 0.0f) << "zeroed at " << i;
    std::vector<float> host(35), back(35, -1.0f);
    std::iota(host.begin(), host.end(), 0.5f);
    be->from_host(a, host.data());
    be->copy(b, a);  // shapes may differ, element counts may not
    be->to_host(back.data(), b);
    EXPECT_EQ(back, host);
    Tensor ids_in = owned.alloc({6}, DType::i32), ids_out = owned.alloc({2, 3}, DType::i32);
    const std::vector<int32_t> tokens{3, 1, 4, 1, 5, 9};
    be->from_host(ids_in, tokens.data());
    be->copy(ids_out, ids_in);
    std::vector<int32_t> got(6);
    be->to_host(got.data(), ids_out);
    EXPECT_EQ(got, tokens);
    EXPECT_THROW(be->copy(owned.alloc({34}), a), Error);
  }
}

TEST_F(BackendOps, CopyColumnsGathersAndScatters) {
  const int64_t n = 13, c = 5, t = 3;
  Tensor whole = randn({n, c * t});
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    Tensor rebuilt = full({n, c * t}, kNaN);
    for (int64_t r = 0; r < t; ++r) {
      Tensor part = full({n, c}, kNaN);
      be->copy_columns(part, 0, whole, r * c, c);  // scatter: rank r's columns
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < c; ++j)
          ASSERT_EQ(part.f32()[i * c + j], whole.f32()[i * c * t + r * c + j]);
      be->copy_columns(rebuilt, r * c, part, 0, c);  // gather: back into place
    }
    for (int64_t i = 0; i < whole.numel(); ++i) ASSERT_EQ(rebuilt.f32()[i], whole.f32()[i]);
    EXPECT_THROW(be->copy_columns(rebuilt, c * t - 1, whole, 0, 2), Error);
    EXPECT_THROW(be->copy_columns(full({n + 1, c}, 0.0f), 0, whole, 0, c), Error);
  }
}

// The vocabulary-parallel loss from its pieces, on two "ranks" summed by hand, against the
// whole-vocabulary cross-entropy.
TEST_F(BackendOps, VocabShardLossPieces) {
  const int64_t n = 9, v = 12, half = v / 2;
  Tensor logits = randn({n, v}, 3.0f), targets = ids({n}, int32_t(v));
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    Tensor max = full({n}, -INFINITY), sumexp = full({n}, 0.0f), target = full({n}, 0.0f);
    std::vector<Tensor> parts, local_max, local_sumexp;
    for (int64_t r = 0; r < 2; ++r) {
      parts.push_back(full({n, half}, 0.0f));
      be->copy_columns(parts[r], 0, logits, r * half, half);
      local_max.push_back(full({n}, 0.0f));
      local_sumexp.push_back(full({n}, 0.0f));
      be->logits_row_stats(local_max[r], local_sumexp[r], parts[r]);
      for (int64_t i = 0; i < n; ++i)
        max.f32()[i] = std::max(max.f32()[i], local_max[r].f32()[i]);  // the max's all-reduce
    }
    for (int64_t r = 0; r < 2; ++r) {
      Tensor s = full({n}, kNaN), t = full({n}, kNaN);
      be->cross_entropy_shard_partials(s, t, local_sumexp[r], local_max[r], max, parts[r], targets,
                                       r * half);
      be->accumulate(sumexp, s);  // the sums' all-reduce
      be->accumulate(target, t);
    }
    Tensor losses = full({n}, kNaN), want = full({n}, kNaN), probs = full({n, v}, 0.0f);
    be->cross_entropy_shard_losses(losses, sumexp, target, max);
    ref->cross_entropy_forward(want, probs, logits, targets);
    EXPECT_TRUE(all_close(losses, want));
  }
}

// ---------------------------------------------------------------------------------------
// AdamW and the device scalars: identities, formulas and refusals.

// The one pass over a flat buffer (no-decay ranges, a device control tensor, the compute copy
// written) is, bit for bit, the per-parameter updates and the conversion it replaces.
TEST_F(BackendOps, AdamwOnePassIsThePerParameterUpdates) {
  const int64_t n = 37 * 24 + 5;
  const ElementRange gaps[] = {{0, 16}, {100, 64}, {500, 3}, {n - 5, 5}};
  Tensor param = randn({n}), grad = randn({n}, 2.0f), m = randn({n}, 0.1f);
  Tensor v = uniform({n}, 0.0f, 0.2f);
  AdamWArgs args;
  args.lr = 1e-2f, args.weight_decay = 0.1f, args.step = 7, args.no_decay = gaps;
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    for (const float apply : {1.0f, 0.0f}) {
      std::vector<float> control{0.25f, apply};  // [kControlScale, kControlApply]
      std::vector<uint16_t> compute(size_t(n), 0);
      Tensor p1 = clone(param), m1 = clone(m), v1 = clone(v);
      be->adamw_update(p1, Tensor{compute.data(), {n}, DType::bf16}, grad, m1, v1,
                       host_tensor(std::span(control)), args);
      // The same, range by range, as AdamW::step used to issue it.
      Tensor p2 = clone(param), m2 = clone(m), v2 = clone(v);
      if (apply != 0.0f) {
        int64_t at = 0;
        auto part = [&](int64_t lo, int64_t hi, float decay) {
          if (hi <= lo) return;
          AdamWArgs a = args;
          a.no_decay = {};
          a.weight_decay = decay, a.grad_scale = 0.25f;
          const Shape s{hi - lo};
          be->adamw_update(p2.view(lo, s), Tensor{}, grad.view(lo, s), m2.view(lo, s),
                           v2.view(lo, s), Tensor{}, a);
        };
        for (const ElementRange& r : gaps) {
          part(at, r.offset, 0.1f);
          part(r.offset, r.offset + r.count, 0.0f);
          at = r.offset + r.count;
        }
        part(at, n, 0.1f);
      }
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(p1.f32()[i], p2.f32()[i]) << "element " << i << " apply " << apply;
        ASSERT_EQ(m1.f32()[i], m2.f32()[i]) << "element " << i;
        ASSERT_EQ(v1.f32()[i], v2.f32()[i]) << "element " << i;
        ASSERT_EQ(compute[size_t(i)], apply != 0.0f ? bf16_from_float(p2.f32()[i]) : 0)
            << "element " << i;
      }
    }
  }
}

// The device scalars against what the host used to compute from sum and sum_squares.
TEST_F(BackendOps, DeviceScalars) {
  const int64_t n = 3 * 16384 + 77;
  Tensor x = randn({n});
  const SumRange ranges[] = {{0, 1000, 1}, {1000, 20000, 0}, {30000, 77, 1}, {40000, n - 40000, 0}};
  for (Backend* be : {cpu.get(), ref.get()}) {
    SCOPED_TRACE(be->name());
    std::vector<double> out(3, -1.0);
    be->sum_squares_ranges(Tensor{out.data(), {3}, DType::f64}, x, ranges);
    double want[3] = {0.0, 0.0, 0.0};
    for (const SumRange& r : ranges) want[r.slot] += be->sum_squares(x.view(r.offset, {r.count}));
    EXPECT_EQ(out[0], want[0]);
    EXPECT_EQ(out[1], want[1]);
    EXPECT_EQ(out[2], 0.0);  // no range
    double acc = 0.5;
    const Tensor acc_t{&acc, {1}, DType::f64};
    be->accumulate_mean(acc_t, x);
    EXPECT_EQ(acc, 0.5 + double(float(be->sum(x) / double(n))));
    double a = 9.0, b = 3.0, r = 0.0;
    const Tensor a_t{&a, {1}, DType::f64}, b_t{&b, {1}, DType::f64}, r_t{&r, {1}, DType::f64};
    be->scalar_add(r_t, a_t, b_t);
    EXPECT_EQ(r, 12.0);
    be->scalar_divide(r_t, r_t, 3.0);
    EXPECT_EQ(r, 4.0);
    be->scalar_sqrt(r_t, r_t);
    EXPECT_EQ(r, 2.0);
    // f64 to f32 and back, as a scalar travels through a communicator.
    float f = 0.0f;
    const Tensor f_t{&f, {1}};
    double third = 1.0 / 3.0;
    be->copy(f_t, Tensor{&third, {1}, DType::f64});
    EXPECT_EQ(f, float(1.0 / 3.0));
    be->copy(r_t, f_t);
    EXPECT_EQ(r, double(float(1.0 / 3.0)));
    // The clip factor and the non-finite flag, as train_step.h's clip_factor.
    std::vector<float> control(2, -1.0f);
    const Tensor c_t = host_tensor(std::span(control));
    double loss = 2.0, norm = 5.0;
    const Tensor loss_t{&loss, {1}, DType::f64}, norm_t{&norm, {1}, DType::f64};
    be->clip_and_check(c_t, loss_t, norm_t, 1.0);
    EXPECT_EQ(control[kControlScale], float(1.0 / (5.0 + 1e-6)));
    EXPECT_EQ(control[kControlApply], 1.0f);
    be->clip_and_check(c_t, loss_t, norm_t, 10.0);
    EXPECT_EQ(control[kControlScale], 1.0f);
    norm = std::numeric_limits<double>::infinity();
    be->clip_and_check(c_t, loss_t, norm_t, 0.0);
    EXPECT_EQ(control[kControlApply], 0.0f);
    loss = std::nan(""), norm = 1.0;
    be->clip_and_check(c_t, loss_t, norm_t, 0.0);
    EXPECT_EQ(control[kControlApply], 0.0f);
    // Refusals name the op.
    float not_f64 = 0.0f;
    EXPECT_THROW(be->scalar_sqrt(Tensor{&not_f64, {1}}, r_t), Error);
    const SumRange outside[] = {{n - 1, 2, 0}};
    EXPECT_THROW(be->sum_squares_ranges(Tensor{out.data(), {3}, DType::f64}, x, outside), Error);
  }
}

// Every backend refuses the same bad operands with the same message, checked once in
// Backend (backend.cpp) before any implementation runs: the counting backend, which runs
// nothing, refuses exactly what the kernels would.
TEST_F(BackendOps, OperandsAreCheckedOnceForEveryBackend) {
  CountingBackend counting;
  Tensor x = randn({4, 8}), out = randn({4, 8}), rstd = randn({4}), short_weight = randn({7});
  int32_t id_storage[4] = {0, 1, 2, 3};
  const Tensor floats_as_ids = randn({4});
  for (Backend* be : {cpu.get(), ref.get(), static_cast<Backend*>(&counting)}) {
    SCOPED_TRACE(be->name());
    auto message = [](const std::function<void()>& call) {
      try {
        call();
      } catch (const Error& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    const std::string m = message([&] { be->rmsnorm_forward(out, rstd, x, short_weight, 1e-5f); });
    EXPECT_NE(m.find(std::string(be->name()) + " backend: rmsnorm_forward: weight has 7 elements"),
              std::string::npos)
        << m;
    const std::string ids = message([&] { be->first_outside(floats_as_ids, 0, 9); });
    EXPECT_NE(ids.find("first_outside: ids must be i32"), std::string::npos) << ids;
    // A tensor of another device (as a host tensor reaching the cuda backend would be).
    Tensor elsewhere = x;
    elsewhere.device = Device::cuda;
    const std::string device = message([&] { be->add(out, x, elsewhere); });
    EXPECT_NE(device.find("add: got a cuda tensor"), std::string::npos) << device;
    const Tensor ids_ok{id_storage, {4}, DType::i32};
    const std::string emb = message([&] { be->embedding_forward(out, ids_ok, randn({10, 7})); });
    EXPECT_NE(emb.find("embedding_forward: out has 32 elements"), std::string::npos) << emb;
  }
}

TEST_F(BackendOps, AdamwFirstStepFromZeroMoments) {
  // Step 1 from m = v = 0: mhat = g, vhat = g^2, so the update is ~lr * sign(g).
  const int64_t n = 41;
  Tensor param = randn({n}), grad = randn({n}), m = full({n}, 0.0f), v = full({n}, 0.0f);
  AdamWArgs args;
  args.lr = 1e-3f, args.weight_decay = 0.0f;
  Tensor p = clone(param);
  ref->adamw_update(p, Tensor{}, grad, m, v, Tensor{}, args);
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad.f32()[i];
    EXPECT_NEAR(p.f32()[i], param.f32()[i] - 1e-3 * g / (std::abs(g) + 1e-8), 1e-6);
  }
}

// ---------------------------------------------------------------------------------------
// dtypes: the raw kernels are fp32; bf16 rounding; the widening backend.

// The reference's own kernels are fp32: bf16 reaches them only through the widening backend
// (make_backend wraps it in it), and it says so. The cpu kernels take bf16 themselves
// (test_bf16_host_kernels.cpp).
TEST_F(BackendOps, RawReferenceRejectsBf16) {
  Tensor bf_x = arena.alloc({4, 8}, DType::bf16), bf_out = arena.alloc({4, 8}, DType::bf16);
  Tensor x = randn({4, 8}), out = nans({4, 8}), w = randn({8}), rstd = nans({4});
  EXPECT_FALSE(ref->bf16_unsupported().empty());
  EXPECT_THROW(ref->silu_forward(bf_out, bf_x), Error);
  EXPECT_THROW(ref->silu_forward(out, bf_x), Error);
  EXPECT_THROW(ref->silu_forward(bf_out, x), Error);
  EXPECT_THROW(ref->add(bf_out, bf_x, bf_x), Error);
  EXPECT_THROW(ref->rmsnorm_forward(out, rstd, bf_x, w, 1e-5f), Error);
  EXPECT_THROW(ref->sum_squares(bf_x), Error);
  try {
    ref->silu_forward(bf_out, bf_x);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("bf16"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("silu_forward"), std::string::npos) << e.what();
  }
  for (const char* name : {"cpu", "cpu-widened", "reference"})
    EXPECT_EQ(make_backend(name)->bf16_unsupported(), "") << name;
  EXPECT_EQ(make_cpu_backend()->bf16_unsupported(), "");
}

// Round to nearest, ties to even; NaN stays NaN; overflow rounds to infinity.
TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_float(1.0f), 0x3f80);
  // 1 + 2^-8 is half-way between 1 and 1 + 2^-7: to the even one, 1.
  EXPECT_EQ(bf16_from_float(1.0f + 0x1p-8f), 0x3f80);
  // 1 + 3·2^-8 is half-way between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one.
  EXPECT_EQ(bf16_from_float(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(bf16_from_float(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // just above half: up
  EXPECT_EQ(bf16_from_float(-2.5f), 0xc020);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16_from_float(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_TRUE(std::isnan(round_to_bf16(kNaN)));
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(round_to_bf16(0x1p-130f), 0x1p-130f);  // subnormals keep their top bits
  for (float f : {0.1f, -3.14159f, 1e-20f, 6.5e4f}) {
    const float r = round_to_bf16(f);
    EXPECT_LE(std::fabs(r - f), std::fabs(f) * 0x1p-8f) << f;
  }
}

// The bf16 run of a kernel through the widening backend is the fp32 kernel on the
// bf16-rounded inputs with its output rounded: on the reference backend exactly, and the cpu
// backend stays within its fp32 tolerance of that.
class WideningOps : public BackendOps {
 protected:
  std::unique_ptr<Backend> wide_ref = make_backend("reference");
  Tensor to_bf16(const Tensor& t) {
    Tensor b = arena.alloc(t.shape, DType::bf16);
    for (int64_t i = 0; i < t.numel(); ++i) b.bf16()[i] = bf16_from_float(t.f32()[i]);
    return b;
  }
  Tensor rounded(const Tensor& t) {
    Tensor r = clone(t);
    for (int64_t i = 0; i < t.numel(); ++i) r.f32()[i] = round_to_bf16(t.f32()[i]);
    return r;
  }
  Tensor widened(const Tensor& b) {
    Tensor t = arena.alloc(b.shape);
    for (int64_t i = 0; i < b.numel(); ++i) t.f32()[i] = bf16_to_float(b.bf16()[i]);
    return t;
  }
};

// TP overlap (parallel/tp_overlap.h) runs a block's activation GEMMs on half the rows at a
// time and promises the serial pass's bits: a row of x·Wᵀ (the forward) or of dy·W (the
// activation gradient) must not depend on how many rows the GEMM is given. Shapes of a tiny
// test block, of a skinny one (few rows and columns over a long k, where a GEMM library is
// most tempted to split k) and of a bench block (rank 256 of d 1024); M and M/2 rows, in fp32
// and with bf16 operands.
TEST_F(WideningOps, GemmRowsDoNotDependOnM) {
  struct Shape3 {
    int64_t m, n, k;
  };
  for (const Shape3 s : {Shape3{64, 8, 32}, Shape3{32, 8, 1024}, Shape3{512, 256, 1024},
                          Shape3{512, 1024, 256}})
    for (bool trans_b : {true, false})
      for (bool bf16 : {false, true})
        for (Backend* be : {cpu.get(), wide_ref.get()}) {
          SCOPED_TRACE(fmt::format("{} m {} n {} k {} {} {}", be->name(), s.m, s.n, s.k,
                                   trans_b ? "x·Wᵀ" : "dy·W", bf16 ? "bf16" : "f32"));
          // x [m, k]; W [n, k] (x·Wᵀ) or [k, n] (dy·W, dy being x here); y [m, n].
          Tensor x = randn({s.m, s.k}), w = randn(trans_b ? Shape{s.n, s.k} : Shape{s.k, s.n});
          if (bf16) x = to_bf16(x), w = to_bf16(w);
          Tensor whole = full({s.m, s.n}, kNaN), halves = full({s.m, s.n}, kNaN);
          auto gemm = [&](Tensor y, int64_t row0, int64_t rows) {
            GemmArgs g;
            g.trans_b = trans_b;
            g.m = rows, g.n = s.n, g.k = s.k;
            g.a = static_cast<const char*>(x.data) + row0 * s.k * dtype_size(x.dtype);
            g.lda = s.k;
            g.b = w.data, g.ldb = trans_b ? s.k : s.n;
            g.c = y.f32() + row0 * s.n, g.ldc = s.n;
            g.a_dtype = x.dtype, g.b_dtype = w.dtype;
            be->gemm(g);
          };
          gemm(whole, 0, s.m);
          gemm(halves, 0, s.m / 2);
          gemm(halves, s.m / 2, s.m / 2);
          int64_t differ = 0;
          for (int64_t i = 0; i < whole.numel(); ++i)
            differ += std::bit_cast<uint32_t>(whole.f32()[i]) !=
                      std::bit_cast<uint32_t>(halves.f32()[i]);
          EXPECT_EQ(differ, 0) << "of " << whole.numel() << " elements";
        }
}

TEST_F(WideningOps, CopyConvertsBothWays) {
  Tensor x = randn({5, 7});
  for (Backend* be : {cpu.get(), wide_ref.get()}) {
    Tensor b = arena.alloc(x.shape, DType::bf16), back = nans(x.shape);
    be->copy(b, x);
    be->copy(back, b);
    EXPECT_TRUE(all_close(back.f32(), rounded(x).f32(), x.numel(), 0.0, 0.0)) << be->name();
  }
  EXPECT_THROW(cpu->copy(arena.alloc({3}, DType::bf16), arena.alloc({3}, DType::i32)), Error);
}

TEST_F(WideningOps, ElementwiseAndNormKernelsRoundOnce) {
  Tensor x = randn({6, 16}), y = randn({6, 16}), w = randn({16}, 0.5f, 1.0f);
  const Tensor xb = to_bf16(x), yb = to_bf16(y);
  Tensor out_b = arena.alloc(x.shape, DType::bf16), rstd_b = nans({6});
  Tensor out = nans(x.shape), rstd = nans({6});
  // add
  wide_ref->add(out_b, xb, yb);
  ref->add(out, rounded(x), rounded(y));
  EXPECT_TRUE(all_close(widened(out_b).f32(), rounded(out).f32(), out.numel(), 0.0, 0.0));
  // add in place (out aliases a)
  Tensor acc_b = clone(xb);
  wide_ref->add(acc_b, acc_b, yb);
  EXPECT_TRUE(all_close(widened(acc_b).f32(), rounded(out).f32(), out.numel(), 0.0, 0.0));
  // rmsnorm: bf16 x and out, fp32 statistic and weight
  wide_ref->rmsnorm_forward(out_b, rstd_b, xb, w, 1e-5f);
  ref->rmsnorm_forward(out, rstd, rounded(x), w, 1e-5f);
  EXPECT_TRUE(all_close(widened(out_b).f32(), rounded(out).f32(), out.numel(), 0.0, 0.0));
  EXPECT_TRUE(all_close(rstd_b.f32(), rstd.f32(), 6, 0.0, 0.0));
  // The cpu backend: the same within fp32 tolerance plus one bf16 rounding.
  Tensor cpu_out = arena.alloc(x.shape, DType::bf16), cpu_rstd = nans({6});
  cpu->rmsnorm_forward(cpu_out, cpu_rstd, xb, w, 1e-5f);
  EXPECT_TRUE(all_close(widened(cpu_out).f32(), widened(out_b).f32(), out.numel(), 1e-6, 8e-3));
  // Backward adds into a bf16 gradient: widened, added in fp32, rounded once.
  Tensor dout = randn(x.shape), dx_b = to_bf16(randn(x.shape)), dw = randn({16});
  Tensor dx = widened(dx_b), dw_ref = clone(dw);
  wide_ref->rmsnorm_backward(dx_b, dw, to_bf16(dout), xb, w, rstd_b);
  ref->rmsnorm_backward(dx, dw_ref, rounded(dout), rounded(x), w, rstd);
  EXPECT_TRUE(all_close(widened(dx_b).f32(), rounded(dx).f32(), dx.numel(), 0.0, 0.0));
  EXPECT_TRUE(all_close(dw.f32(), dw_ref.f32(), 16, 0.0, 0.0));
}

TEST_F(WideningOps, AttentionTakesBf16) {
  Tensor q = randn({2, 5, 4, 8}), k = randn({2, 5, 2, 8}), v = randn({2, 5, 2, 8});
  Tensor out_b = arena.alloc(q.shape, DType::bf16), lse = nans({2, 4, 5});
  Tensor out = nans(q.shape), lse_ref = nans({2, 4, 5});
  wide_ref->attention_forward(out_b, lse, to_bf16(q), to_bf16(k), to_bf16(v));
  ref->attention_forward(out, lse_ref, rounded(q), rounded(k), rounded(v));
  EXPECT_TRUE(all_close(widened(out_b).f32(), rounded(out).f32(), out.numel(), 0.0, 0.0));
  EXPECT_TRUE(all_close(lse.f32(), lse_ref.f32(), lse.numel(), 0.0, 0.0));
  Tensor cpu_out = arena.alloc(q.shape, DType::bf16), cpu_lse = nans({2, 4, 5});
  cpu->attention_forward(cpu_out, cpu_lse, to_bf16(q), to_bf16(k), to_bf16(v));
  EXPECT_TRUE(all_close(widened(cpu_out).f32(), widened(out_b).f32(), out.numel(), 1e-5, 8e-3));
}

// GEMMs with bf16 operands: transposed, strided (a view's columns), batched with a broadcast
// operand and gaps between the batch's outputs (grouped projections: other tensors live
// there, untouched), accumulating into fp32 (a parameter gradient) or into bf16.
TEST_F(WideningOps, GemmOperandsOfEitherDtype) {
  const int64_t m = 5, n = 6, k = 7, batch = 3, gap = 3;
  Tensor a = randn({batch, k, m + 2}), b = randn({n, k}), c = randn({batch, m * n + gap});
  for (bool c_bf16 : {false, true})
    for (float beta : {0.0f, 1.0f}) {
      SCOPED_TRACE(fmt::format("c {} beta {}", c_bf16 ? "bf16" : "f32", beta));
      GemmArgs g;
      g.trans_a = true, g.trans_b = true;
      g.m = m, g.n = n, g.k = k, g.beta = beta, g.batch = batch;
      g.lda = m + 2, g.stride_a = k * (m + 2);
      g.ldb = k, g.stride_b = 0;  // one B for the whole batch
      g.ldc = n, g.stride_c = m * n + gap;
      // The oracle: fp32 on the rounded operands (C rounded when it is bf16).
      Tensor want = c_bf16 ? rounded(c) : clone(c);
      GemmArgs f = g;
      f.a = rounded(a).data, f.b = rounded(b).data, f.c = want.data;
      ref->gemm(f);
      if (c_bf16) want = rounded(want);
      for (Backend* be : {wide_ref.get(), cpu.get()}) {
        SCOPED_TRACE(be->name());
        Tensor ab = to_bf16(a), bb = to_bf16(b), cc = c_bf16 ? to_bf16(c) : clone(c);
        GemmArgs h = g;
        h.a = ab.data, h.b = bb.data, h.c = cc.data;
        h.dtypes_of(ab, bb, cc);
        be->gemm(h);
        const Tensor got = c_bf16 ? widened(cc) : cc;
        for (int64_t i = 0; i < batch; ++i)
          for (int64_t j = m * n; j < m * n + gap; ++j) {
            const int64_t at = i * (m * n + gap) + j;
            EXPECT_EQ(got.f32()[at], c_bf16 ? round_to_bf16(c.f32()[at]) : c.f32()[at]) << at;
          }
        const bool exact = be == wide_ref.get();
        EXPECT_TRUE(all_close(got.f32(), want.f32(), want.numel(), exact ? 0.0 : 1e-5,
                              exact ? 0.0 : (c_bf16 ? 8e-3 : 1e-5)));
      }
    }
}

TEST_F(WideningOps, SaysHowGemmsRun) {
  const std::string path = cpu->bf16_gemm_path();
  EXPECT_NE(path, "none");
  EXPECT_NE(wide_ref->bf16_gemm_path().find("widened"), std::string::npos);
  std::printf("cpu bf16 GEMMs: %s\n", path.c_str());
}

TEST_F(BackendOps, Names) {
  EXPECT_EQ(ref->name(), "reference");
  EXPECT_EQ(make_backend("reference")->name(), "reference");
}

// ---------------------------------------------------------------------------------------
// The oracle checked against itself: reference backward kernels vs central differences of
// the reference forward kernels, loss = sum(out * w) for a random w.

class ReferenceGradcheck : public BackendOps {
 protected:
  double dot(const Tensor& a, const Tensor& b) {
    double s = 0.0;
    for (int64_t i = 0; i < a.numel(); ++i) s += double(a.f32()[i]) * b.f32()[i];
    return s;
  }
  void check(const char* what, Tensor x, const Tensor& analytic,
             const std::function<double()>& loss) {
    SCOPED_TRACE(what);
    const float h = 1e-2f;
    double max_grad = 1.0;
    for (int64_t i = 0; i < analytic.numel(); ++i)
      max_grad = std::max(max_grad, std::abs(double(analytic.f32()[i])));
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = x.f32()[i];
      x.f32()[i] = saved + h;
      const double plus = loss();
      const float up = x.f32()[i];
      x.f32()[i] = saved - h;
      const double minus = loss();
      const float down = x.f32()[i];
      x.f32()[i] = saved;
      const double numeric = (plus - minus) / (double(up) - double(down));
      EXPECT_NEAR(analytic.f32()[i], numeric, 2e-3 * max_grad) << "element " << i;
    }
  }
};

TEST_F(ReferenceGradcheck, Norms) {
  Backend& be = *ref;
  const int64_t N = 5, C = 8;
  Tensor x = randn({N, C}, 1.0f, 0.5f), w = randn({C}, 0.5f, 1.0f), b = randn({C}, 0.5f);
  Tensor wout = randn({N, C}), out = nans({N, C}), mean = nans({N}), rstd = nans({N});
  auto rms_loss = [&] {
    be.rmsnorm_forward(out, rstd, x, w, 1e-5f);
    return dot(out, wout);
  };
  rms_loss();
  Tensor dx = full({N, C}, 0.0f), dw = full({C}, 0.0f), db = full({C}, 0.0f);
  be.rmsnorm_backward(dx, dw, wout, x, w, rstd);
  check("rmsnorm dx", x, dx, rms_loss);
  check("rmsnorm dweight", w, dw, rms_loss);

  auto ln_loss = [&] {
    be.layernorm_forward(out, mean, rstd, x, w, b, 1e-5f);
    return dot(out, wout);
  };
  ln_loss();
  be.fill_zero(dx), be.fill_zero(dw);
  be.layernorm_backward(dx, dw, db, wout, x, w, mean, rstd);
  check("layernorm dx", x, dx, ln_loss);
  check("layernorm dweight", w, dw, ln_loss);
  check("layernorm dbias", b, db, ln_loss);
}

TEST_F(ReferenceGradcheck, Attention) {
  Backend& be = *ref;
  Tensor q = randn({2, 5, 4, 4}), k = randn({2, 5, 2, 4}), v = randn({2, 5, 2, 4});
  Tensor wout = randn(q.shape), out = nans(q.shape), lse = nans({2, 4, 5});
  auto loss = [&] {
    be.attention_forward(out, lse, q, k, v);
    return dot(out, wout);
  };
  loss();
  // Backward reads out and lse, so keep the unperturbed forward's copies.
  Tensor out0 = clone(out), lse0 = clone(lse);
  Tensor dq = full(q.shape, 0.0f), dk = full(k.shape, 0.0f), dv = full(v.shape, 0.0f);
  be.attention_backward(dq, dk, dv, wout, out0, lse0, q, k, v);
  check("attention dq", q, dq, loss);
  check("attention dk", k, dk, loss);
  check("attention dv", v, dv, loss);
}

TEST_F(ReferenceGradcheck, Activations) {
  Backend& be = *ref;
  Tensor x = randn({6, 7}, 2.0f), up = randn({6, 7}), wout = randn({6, 7}), out = nans({6, 7});
  auto silu_loss = [&] {
    be.silu_forward(out, x);
    return dot(out, wout);
  };
  Tensor dx = full({6, 7}, 0.0f), dup = full({6, 7}, 0.0f);
  be.silu_backward(dx, wout, x);
  check("silu dx", x, dx, silu_loss);
  for (bool act : {true, false}) {
    auto loss = [&] {
      be.swiglu_forward(out, x, up, act);
      return dot(out, wout);
    };
    be.fill_zero(dx), be.fill_zero(dup);
    be.swiglu_backward(dx, dup, wout, x, up, act);
    check(act ? "swiglu dgate" : "glu dgate", x, dx, loss);
    check(act ? "swiglu dup" : "glu dup", up, dup, loss);
  }
}

TEST_F(ReferenceGradcheck, CrossEntropyEmbeddingRope) {
  Backend& be = *ref;
  {
    Tensor logits = randn({6, 9}, 2.0f), targets = ids({6}, 9);
    Tensor losses = nans({6}), probs = nans({6, 9});
    auto loss = [&] {
      be.cross_entropy_forward(losses, probs, logits, targets);
      double s = 0.0;
      for (int64_t i = 0; i < 6; ++i) s += 0.5 * losses.f32()[i];
      return s;
    };
    loss();
    Tensor dlogits = full({6, 9}, 0.0f);
    be.cross_entropy_backward(dlogits, probs, targets, 0.5f);
    check("cross_entropy dlogits", logits, dlogits, loss);
  }
  {
    Tensor tokens = ids({9}, 5), table = randn({5, 6}), wout = randn({9, 6}), out = nans({9, 6});
    auto loss = [&] {
      be.embedding_forward(out, tokens, table);
      return dot(out, wout);
    };
    Tensor dtable = full({5, 6}, 0.0f);
    be.embedding_backward(dtable, tokens, wout);
    check("embedding dtable", table, dtable, loss);
  }
  {
    // The loss reads q alone; k is rotated beside it.
    Tensor x = randn({1, 6, 2, 8}), wout = randn({1, 6, 2, 8}), y = nans({1, 6, 2, 8}),
           k = randn({1, 6, 1, 8});
    auto loss = [&] {
      std::copy_n(x.f32(), x.numel(), y.f32());
      be.rope_forward(y, k, 100.0f);
      return dot(y, wout);
    };
    Tensor dx = clone(wout), dk = randn({1, 6, 1, 8});
    be.rope_backward(dx, dk, 100.0f);
    check("rope dx", x, dx, loss);
  }
}

// MFU's denominator: a rate above the measured peak is never given as an efficiency above 1
// (the peak is measured again, and if it still falls short there is no figure); a rate
// below it is.
TEST(GemmPeak, NeverGivesAnEfficiencyAboveOne) {
  auto be = make_backend("cpu");
  GemmPeak peak(*be);
  ASSERT_GT(peak.gflops(), 0.0);
  const double measured = peak.gflops();
  const std::optional<double> half = peak.utilization(measured / 2);
  ASSERT_TRUE(half.has_value());
  EXPECT_NEAR(*half, 0.5, 1e-12);
  EXPECT_FALSE(peak.utilization(measured * 1e6).has_value());
  EXPECT_GE(peak.gflops(), measured);  // re-measured, keeping the best
}

}  // namespace
}  // namespace bottle
