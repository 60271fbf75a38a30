// The per-element math of core/kernel_math.h (shared by the CPU backends and the CUDA
// kernels) against independent definitions in double: gradients against central finite
// differences of the forward function, the online softmax against a direct log-sum-exp,
// AdamW against the update written out in double, bf16 rounding against a rounding decided
// by comparing distances.
//
// Tolerances are in units of u = 2^-24, float's unit roundoff. The finite differences are
// taken in double with steps chosen so that their own error (truncation h² f''' / 6 plus
// cancellation 1e-16 |f| / h) is below 1e-9 of the result, far under float's: every bound
// below is the error of the float formula alone, derived from the number of roundings it
// makes and from any cancellation it cannot avoid.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <random>
#include <vector>

#include "core/kernel_math.h"

namespace bottle {
namespace {

namespace km = kmath;

constexpr double u = 0x1p-24;  // float's unit roundoff
constexpr float kInf = std::numeric_limits<float>::infinity();

double sigmoid_d(double x) { return 1.0 / (1.0 + std::exp(-x)); }
// sigmoid(x) correctly rounded to float: the tests measure the formulas, not a backend's
// own fast sigmoid.
float sigmoid_f(float x) { return float(sigmoid_d(x)); }
double silu_d(double x) { return x * sigmoid_d(x); }

// Central difference of f at x with step h.
double central_difference(const std::function<double(double)>& f, double x, double h) {
  return (f(x + h) - f(x - h)) / (2.0 * h);
}

std::vector<float> grid(float lo, float hi, int n) {
  std::vector<float> xs;
  for (int i = 0; i <= n; ++i) xs.push_back(lo + (hi - lo) * float(i) / float(n));
  return xs;
}

// --- Activations.

// silu(x, s) = x s: one rounding of an exact product of x and a correctly rounded s, so two
// half-ulps. silu_grad = s (1 + x (1 - s)): s carries u, 1 - s is exact (Sterbenz, s in
// [1/2, 1)) or carries u |s|; the products and the sum add one rounding each. An error Δs
// moves the result by |1 + x - 2 x s| Δs <= (1 + 2|x|) Δs, so the bound grows with |x| —
// 6 u (1 + 2|x|) covers every term.
TEST(KernelMath, SiluAndItsGradientMatchFiniteDifferences) {
  for (float x : grid(-12.0f, 12.0f, 480)) {
    const float s = sigmoid_f(x);
    EXPECT_NEAR(km::silu(x, s), silu_d(x), 2 * u * std::fabs(silu_d(x)) + 1e-30) << x;
    const double want = central_difference(silu_d, x, 1e-5);
    const double tol = 6 * u * (1 + 2 * std::fabs(x));
    EXPECT_NEAR(km::silu_grad(x, s), want, tol) << "x=" << x;
    // silu_dx is dout · silu'(x), rounded in another order: one more rounding of |dout| · it.
    for (float dout : {1.0f, -0.37f, 5.5f}) {
      EXPECT_NEAR(km::silu_dx(dout, x, s), dout * want, std::fabs(dout) * (tol + 2 * u * 1.2))
          << "x=" << x << " dout=" << dout;
    }
  }
}

// SwiGLU out = act(g) u. Its gradients against central differences of out in g and in u,
// for the SiLU gate and the identity gate; the bounds are silu's and silu_grad's above,
// scaled by |dout| and |u|, with one more rounding per extra product.
TEST(KernelMath, SwigluGradientsMatchFiniteDifferences) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 400; ++i) {
    const float g = 4.0f * normal(rng), up = 2.0f * normal(rng), dout = normal(rng);
    const float s = sigmoid_f(g);
    for (bool gate_act : {true, false}) {
      auto out = [&](double gv, double uv) { return (gate_act ? silu_d(gv) : gv) * uv; };
      const double want_dg =
          dout * central_difference([&](double v) { return out(v, up); }, g, 1e-5);
      const double want_du =
          dout * central_difference([&](double v) { return out(g, v); }, up, 1e-5);
      const double scale = std::fabs(dout) * std::fabs(up);
      const double tol_dg =
          gate_act ? scale * (6 * u * (1 + 2 * std::fabs(g)) + 3 * u * 1.2) : 2 * u * scale;
      const double act = gate_act ? std::fabs(silu_d(g)) : std::fabs(g);
      SCOPED_TRACE(::testing::Message()
                   << "g=" << g << " u=" << up << " dout=" << dout << " gate_act=" << gate_act);
      EXPECT_NEAR(km::swiglu(g, up, s, gate_act), out(g, up), 3 * u * act * std::fabs(up) + 1e-30);
      EXPECT_NEAR(km::swiglu_dgate(dout, g, up, s, gate_act), want_dg, tol_dg + 1e-30);
      EXPECT_NEAR(km::swiglu_dup(dout, g, s, gate_act), want_du,
                  3 * u * std::fabs(dout) * act + 1e-30);
    }
  }
}

// --- Norms.

// rstd = 1 / sqrt(Σx² / c + eps): a division, a sum, a square root and a reciprocal, each
// half an ulp (the square root halves its argument's error): 4 u relative at most.
TEST(KernelMath, RstdAndRmsFromSumSquares) {
  for (float ss : {0.0f, 1e-12f, 0.5f, 3.0f, 1234.5f, 7.7e6f}) {
    for (float count : {1.0f, 7.0f, 4096.0f}) {
      const float eps = 1e-6f;
      const double rms = std::sqrt(double(ss) / count + eps);
      EXPECT_NEAR(km::rstd_from_sum_squares(ss, count, eps), 1.0 / rms, 4 * u / rms);
      EXPECT_NEAR(km::rms_from_sum_squares(ss, count, eps, false), rms, 3 * u * rms);
      EXPECT_NEAR(km::rms_from_sum_squares(ss, count, eps, true), 1.0 / rms, 4 * u / rms);
      // The CPU backend's forward and the device's both use rstd_from_sum_squares; the
      // shard path takes rms_from_sum_squares(reciprocal): the same bits.
      EXPECT_EQ(km::rstd_from_sum_squares(ss, count, eps),
                km::rms_from_sum_squares(ss, count, eps, true));
    }
  }
}

// RMSNorm of one row of d values, y_j = x_j w_j rstd, and L = Σ dout_j y_j: dL/dx_k by
// central differences in double against rmsnorm_dx with the row's float statistics. The
// bound is relative to the size of the two terms, rstd |w dout| and |x| rstd³ |dot| / d,
// since they may cancel: the float statistics carry d u (the sums) and 4 u (rstd, which
// enters cubed), and the formula itself 4 roundings: (d + 16) u of the terms' size.
TEST(KernelMath, RmsnormDxMatchesFiniteDifferences) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float eps = 1e-5f;
  for (int d : {1, 2, 7, 33}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(d), w(d), g(d);
      for (int j = 0; j < d; ++j) {
        x[j] = 2.0f * normal(rng);
        w[j] = 1.0f + 0.5f * normal(rng);
        g[j] = normal(rng);
      }
      auto loss = [&](int k, double xk) {
        double ss = 0.0;
        for (int j = 0; j < d; ++j) ss += (j == k ? xk : x[j]) * (j == k ? xk : x[j]);
        const double rstd = 1.0 / std::sqrt(ss / d + eps);
        double l = 0.0;
        for (int j = 0; j < d; ++j) l += double(g[j]) * (j == k ? xk : x[j]) * w[j] * rstd;
        return l;
      };
      float ss = 0.0f, dot = 0.0f;
      for (int j = 0; j < d; ++j) {
        ss += x[j] * x[j];
        dot += w[j] * g[j] * x[j];
      }
      const float rstd = km::rstd_from_sum_squares(ss, float(d), eps);
      const float factor = km::rmsnorm_dx_row_factor(rstd, dot, float(d));
      for (int k = 0; k < d; ++k) {
        const double want = central_difference([&](double v) { return loss(k, v); }, x[k], 1e-4);
        const double terms = double(rstd) * std::fabs(w[k] * g[k]) +
                             std::fabs(x[k]) * double(rstd) * rstd * rstd *
                                 [&] {
                                   double a = 0.0;  // Σ|w g x|: the size of dot's terms
                                   for (int j = 0; j < d; ++j) a += std::fabs(w[j] * g[j] * x[j]);
                                   return a;
                                 }() /
                                 d;
        const float got = km::rmsnorm_dx(g[k], x[k], w[k], rstd, dot, float(d));
        EXPECT_NEAR(got, want, (d + 16) * u * terms) << "d=" << d << " k=" << k;
        // The CPU loop hoists the row's factor: bit for bit the same.
        EXPECT_EQ(got, km::rmsnorm_dx_from_factor(g[k], x[k], w[k], rstd, factor));
      }
    }
  }
}

// LayerNorm y_j = (x_j - mean) rstd w_j + b_j, L = Σ dout_j y_j; layernorm_dx against central
// differences. The row's statistics (rstd, xhat, mean_g, mean_gx) are computed in double and
// rounded once to float, so that what is measured is the formula, not the conditioning of a
// float mean (x − mean loses |x| u / |x − mean| of xhat, unbounded for a nearly constant row).
// Its three terms, |g w|, |mean_g| and |xhat mean_gx| (times rstd), may cancel: with each
// input rounded (u) and the formula's four roundings, 8 u of their size.
TEST(KernelMath, LayernormDxMatchesFiniteDifferences) {
  std::mt19937 rng(13);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const float eps = 1e-5f;
  for (int d : {2, 5, 31}) {
    for (int trial = 0; trial < 20; ++trial) {
      std::vector<float> x(d), w(d), g(d);
      for (int j = 0; j < d; ++j) {
        x[j] = 0.5f + 2.0f * normal(rng);
        w[j] = 1.0f + 0.5f * normal(rng);
        g[j] = normal(rng);
      }
      struct Stats {
        double mean, rstd;
      };
      auto stats = [&](int k, double xk) {
        auto xv = [&](int j) { return j == k ? xk : double(x[j]); };
        double mean = 0.0, var = 0.0;
        for (int j = 0; j < d; ++j) mean += xv(j);
        mean /= d;
        for (int j = 0; j < d; ++j) var += (xv(j) - mean) * (xv(j) - mean);
        return Stats{mean, 1.0 / std::sqrt(var / d + eps)};
      };
      auto loss = [&](int k, double xk) {
        const Stats st = stats(k, xk);
        double l = 0.0;
        for (int j = 0; j < d; ++j)
          l += double(g[j]) * ((j == k ? xk : double(x[j])) - st.mean) * st.rstd * w[j];
        return l;
      };
      const Stats st = stats(-1, 0.0);
      double mean_g = 0.0, mean_gx = 0.0, mean_abs_gx = 0.0;
      for (int j = 0; j < d; ++j) {
        const double gw = double(g[j]) * w[j], xhat = (x[j] - st.mean) * st.rstd;
        mean_g += gw / d;
        mean_gx += gw * xhat / d;
        mean_abs_gx += std::fabs(gw * xhat) / d;
      }
      for (int k = 0; k < d; ++k) {
        const double want = central_difference([&](double v) { return loss(k, v); }, x[k], 1e-5);
        const double gw = double(g[k]) * w[k], xhat = (x[k] - st.mean) * st.rstd;
        const double terms =
            st.rstd * (std::fabs(gw) + std::fabs(mean_g) + std::fabs(xhat) * mean_abs_gx);
        EXPECT_NEAR(
            km::layernorm_dx(float(gw), float(xhat), float(st.rstd), float(mean_g), float(mean_gx)),
            want, 8 * u * terms)
            << "d=" << d << " k=" << k;
      }
    }
  }
}

// --- Rotary embedding.

// HF computes inv_freq = 1 / base^(arange(0, hd, 2).float() / hd) in fp32: the exponent
// rounded to float, a float pow (glibc's powf: under 1 ulp, 2 u relative) and a float
// reciprocal (u): against that with the exponent rounded the same way, in double, 4 u
// relative. Against the exact 1/θ^(2i/hd), the exponent's own rounding (u relative, of an
// exponent below 1) is multiplied by ln θ: (4 + 2 ln θ) u.
TEST(KernelMath, RopeInvFreqIsHfsFp32Formula) {
  for (float theta : {10000.0f, 500000.0f}) {
    for (int64_t hd : {2, 64, 128}) {
      EXPECT_EQ(km::rope_inv_freq(0, hd, theta), 1.0f);
      for (int64_t i = 0; i < hd / 2; ++i) {
        const double as_hf = 1.0 / std::pow(double(theta), double(float(2 * i) / float(hd)));
        const double exact = 1.0 / std::pow(double(theta), 2.0 * double(i) / double(hd));
        const float got = km::rope_inv_freq(i, hd, theta);
        EXPECT_NEAR(got, as_hf, 4 * u * as_hf) << "theta=" << theta << " hd=" << hd << " i=" << i;
        EXPECT_NEAR(got, exact, (4 + 2 * std::log(theta)) * u * exact)
            << "theta=" << theta << " hd=" << hd << " i=" << i;
      }
    }
  }
}

// Rotating by +θ then by −θ with the same float cos/sin is the identity up to cos² + sin²
// (1 within 3 u once both are rounded) and four roundings per coordinate, each at most u of
// the pair's norm: 8 u of the norm. One rotation keeps the norm to 4 u, and matches the
// rotation in double to 4 u of the norm (cos and sin carry u each).
TEST(KernelMath, RopeRotateIsAnIsometryAndItsOwnInverse) {
  std::mt19937 rng(17);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> angle_dist(-3000.0f, 3000.0f);
  for (int i = 0; i < 2000; ++i) {
    const float x1 = 3.0f * normal(rng), x2 = 3.0f * normal(rng), angle = angle_dist(rng);
    const float c = std::cos(angle), s = std::sin(angle);
    const double norm = std::hypot(double(x1), double(x2));
    float a = x1, b = x2;
    km::rope_rotate(a, b, c, s);
    EXPECT_NEAR(std::hypot(double(a), double(b)), norm, 4 * u * norm) << i;
    const double ca = std::cos(double(angle)), sa = std::sin(double(angle));
    EXPECT_NEAR(a, x1 * ca - x2 * sa, 4 * u * norm) << i;
    EXPECT_NEAR(b, x2 * ca + x1 * sa, 4 * u * norm) << i;
    km::rope_rotate(a, b, c, -s);
    EXPECT_NEAR(a, x1, 8 * u * norm) << i;
    EXPECT_NEAR(b, x2, 8 * u * norm) << i;
  }
  float a = 1.5f, b = -2.0f;  // angle 0: exact
  km::rope_rotate(a, b, 1.0f, 0.0f);
  EXPECT_EQ(a, 1.5f);
  EXPECT_EQ(b, -2.0f);
}

// --- Softmax and cross-entropy.

double log_sum_exp_d(const std::vector<float>& v) {
  double mx = -INFINITY, sum = 0.0;
  for (float x : v) mx = std::max(mx, double(x));
  for (float x : v) sum += std::exp(double(x) - mx);
  return mx + std::log(sum);
}

const auto expf_ = [](float x) { return std::exp(x); };

// One chunk's (max, Σexp(x - max)) in float, as a kernel's thread or block computes it.
km::SoftmaxState chunk_state(const float* x, int64_t n) {
  km::SoftmaxState s;
  for (int64_t j = 0; j < n; ++j) s.max = std::max(s.max, x[j]);
  for (int64_t j = 0; j < n; ++j) s.sumexp += std::exp(x[j] - s.max);
  return s;
}

// Random chunks of a row merged in a random order; lse = max + log(sumexp) against a direct
// log-sum-exp in double. sumexp's relative error: each exp under 1 ulp (2 u), a float sum
// of L positive terms L u, each merge an exp and two roundings (4 u): (L + 2 + 4 K) u for K
// chunks of at most L values — an absolute error of that much in log(sumexp) — plus the
// final roundings of log and of the sum with max, u |lse| each.
TEST(KernelMath, SoftmaxMergeOfChunksIsTheLogSumExp) {
  std::mt19937 rng(19);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int n = 1 + int(rng() % 500);
    const float spread = trial % 3 == 0 ? 30.0f : 3.0f, offset = 20.0f * normal(rng);
    std::vector<float> x(n);
    for (float& v : x) v = offset + spread * normal(rng);
    // Cut into chunks (some empty), merged in a shuffled order.
    std::vector<std::pair<int, int>> chunks;
    int longest = 0;
    for (int start = 0; start < n;) {
      const int len = std::min(n - start, int(rng() % 64));
      chunks.emplace_back(start, len);
      longest = std::max(longest, len);
      start += len;
    }
    std::shuffle(chunks.begin(), chunks.end(), rng);
    km::SoftmaxState s;
    for (const auto& [start, len] : chunks) {
      const km::SoftmaxState c = chunk_state(x.data() + start, len);
      if (len == 0) {
        EXPECT_EQ(c.max, -kInf);
      }
      km::softmax_merge(s, c.max, c.sumexp, expf_);
    }
    const double want = log_sum_exp_d(x);
    const double got = double(s.max) + std::log(double(s.sumexp));
    const double tol = (longest + 2 + 4.0 * double(chunks.size())) * u + 2 * u * std::fabs(want);
    EXPECT_NEAR(got, want, tol) << "trial " << trial << " n=" << n << " chunks=" << chunks.size();
  }
  // An empty partial (max −inf) changes nothing, even in an empty state.
  km::SoftmaxState empty;
  km::softmax_merge(empty, -kInf, 0.0f, expf_);
  EXPECT_EQ(empty.max, -kInf);
  EXPECT_EQ(empty.sumexp, 0.0f);
  km::SoftmaxState one{2.0f, 1.5f};
  km::softmax_merge(one, -kInf, 0.0f, expf_);
  EXPECT_EQ(one.max, 2.0f);
  EXPECT_EQ(one.sumexp, 1.5f);
  // Merging into an empty state takes the other pair as it is.
  km::softmax_merge(empty, 2.0f, 1.5f, expf_);
  EXPECT_EQ(empty.max, 2.0f);
  EXPECT_EQ(empty.sumexp, 1.5f);
}

// A vocabulary split over R ranks: each rank's (local max, local Σexp), rescaled to the
// global max by rescaled_sumexp and summed, then cross_entropy_loss; against lse − x_target
// in double. The bound as above, with the R rescalings (an exp and a product, 3 u) and the
// R − 1 additions in place of the merges, plus 2 u of each of |max|, |x_target| and |loss|
// for the final sum and the log's rounding.
TEST(KernelMath, ShardedCrossEntropyIsTheDirectLoss) {
  std::mt19937 rng(23);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 200; ++trial) {
    const int ranks = 1 + int(rng() % 4), per_rank = 1 + int(rng() % 300), v = ranks * per_rank;
    const float spread = trial % 2 ? 8.0f : 2.0f, offset = 10.0f * normal(rng);
    std::vector<float> logits(v);
    for (float& l : logits) l = offset + spread * normal(rng);
    const int target = int(rng() % v);
    std::vector<km::SoftmaxState> local(ranks);
    float mx = -kInf;
    for (int r = 0; r < ranks; ++r) {
      local[r] = chunk_state(logits.data() + r * per_rank, per_rank);
      mx = std::max(mx, local[r].max);
    }
    float sumexp = 0.0f;
    for (int r = 0; r < ranks; ++r)
      sumexp += km::rescaled_sumexp(local[r].sumexp, local[r].max, mx, expf_);
    const float loss = km::cross_entropy_loss(sumexp, mx, logits[target]);
    const double want = log_sum_exp_d(logits) - logits[target];
    const double tol = (per_rank + 2 + 4.0 * ranks) * u +
                       2 * u * (std::fabs(mx) + std::fabs(logits[target]) + std::fabs(want));
    EXPECT_NEAR(loss, want, tol) << "trial " << trial << " ranks=" << ranks << " v=" << v;
    // The unsharded case is the same formula on the whole row's statistics.
    const km::SoftmaxState whole = chunk_state(logits.data(), v);
    EXPECT_NEAR(
        km::cross_entropy_loss(whole.sumexp, whole.max, logits[target]), want,
        (v + 2) * u + 2 * u * (std::fabs(whole.max) + std::fabs(logits[target]) + std::fabs(want)));
  }
}

// d loss / d logit_j = scale (p_j − [j = target]) against central differences of the
// double loss lse − x_target, for p_j the float softmax. p carries (V + 5) u relative (the
// sum's V + 2, its own exp's 2 and the division's 1); p − 1 is exact for p >= 1/2 and else
// one rounding of at most u; the product one more: scale ((V + 5) u p + 2 u).
TEST(KernelMath, CrossEntropyDlogitMatchesFiniteDifferences) {
  std::mt19937 rng(29);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int trial = 0; trial < 30; ++trial) {
    const int v = 2 + int(rng() % 40), target = int(rng() % v);
    const float scale = trial % 2 ? 1.0f / 64.0f : 0.75f;
    std::vector<float> logits(v);
    for (float& l : logits) l = (trial % 3 ? 1.0f : 6.0f) * normal(rng);
    const km::SoftmaxState st = chunk_state(logits.data(), v);
    for (int j = 0; j < v; ++j) {
      auto loss = [&](double lj) {
        double mx = -INFINITY, sum = 0.0;
        for (int k = 0; k < v; ++k) mx = std::max(mx, k == j ? lj : double(logits[k]));
        for (int k = 0; k < v; ++k) sum += std::exp((k == j ? lj : double(logits[k])) - mx);
        return mx + std::log(sum) - (j == target ? lj : double(logits[target]));
      };
      const double want = scale * central_difference(loss, logits[j], 1e-5);
      const float p = std::exp(logits[j] - st.max) / st.sumexp;
      EXPECT_NEAR(km::cross_entropy_dlogit(p, j == target, scale), want,
                  scale * ((v + 5) * u * p + 2 * u) + 1e-9 * scale)
          << "trial " << trial << " j=" << j << " target=" << target;
    }
  }
}

// --- AdamW.

// Ten steps of adamw_step against AdamW written out in double (bias corrections, decoupled
// decay), each side keeping its own moments; the constants are the float ones, widened, so
// that only the arithmetic differs. adamw_bias_correction: powf under 1 ulp of β^t, 1 − β^t
// exact (Sterbenz), the reciprocal half an ulp: (1 / (1 − β^t) + 1) u relative, the 1 / (1 −
// β^t) being the cancellation that 1 − β^t magnifies. The parameter: each step rounds it
// (u |p|) and adds lr times the update's error; the update (of size <= about 1 /
// sqrt(1 − β2)) carries the moments' roundings, a few u per step accumulated, and the bias
// corrections' — 2^-18 absolute per step, i.e. 64 u of an update of size 1, covers them
// with room for the accumulation over ten steps.
TEST(KernelMath, AdamwStepMatchesDoublePrecisionAdamw) {
  for (float beta : {0.9f, 0.95f, 0.999f}) {
    for (int64_t t : {1, 2, 10, 1000}) {
      const double bt = std::pow(double(beta), double(t));
      const double want = 1.0 / (1.0 - bt);
      EXPECT_NEAR(km::adamw_bias_correction(beta, t), want, (1.0 / (1.0 - bt) + 1) * u * want)
          << "beta=" << beta << " t=" << t;
    }
  }
  EXPECT_EQ(km::adamw_bias_correction(0.9f, 1), 1.0f / (1.0f - 0.9f));  // β^1 is β exactly

  std::mt19937 rng(31);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  km::AdamWScalars a{};
  a.lr = 1e-2f;
  a.beta1 = 0.9f;
  a.beta2 = 0.95f;
  a.eps = 1e-8f;
  a.weight_decay = 0.1f;
  a.grad_scale = 0.5f;
  const int kSteps = 10;
  for (int n = 0; n < 200; ++n) {
    float p = normal(rng), m = 0.0f, v = 0.0f;
    double pd = p, md = 0.0, vd = 0.0, tol = 0.0;
    for (int step = 1; step <= kSteps; ++step) {
      const float g = (n % 4 == 0 ? 1e-3f : 1.0f) * normal(rng);
      a.c1 = km::adamw_bias_correction(a.beta1, step);
      a.c2 = km::adamw_bias_correction(a.beta2, step);
      km::adamw_step(p, g, m, v, a);
      const double b1 = a.beta1, b2 = a.beta2, gd = double(g) * double(a.grad_scale);
      md = b1 * md + (1.0 - b1) * gd;
      vd = b2 * vd + (1.0 - b2) * gd * gd;
      const double mhat = md / (1.0 - std::pow(b1, step)), vhat = vd / (1.0 - std::pow(b2, step));
      pd -= double(a.lr) * (mhat / (std::sqrt(vhat) + double(a.eps)) + double(a.weight_decay) * pd);
      tol += u * std::fabs(pd) + double(a.lr) * 0x1p-18;
      SCOPED_TRACE(::testing::Message() << "param " << n << " step " << step);
      EXPECT_NEAR(p, pd, tol);
      EXPECT_NEAR(m, md, 4 * step * u * std::sqrt(vd) + 1e-30);  // |m| <= about sqrt(v)
      EXPECT_NEAR(v, vd, 4 * step * u * vd + 1e-30);             // positive terms
    }
  }
}

// --- bf16.

// Round to nearest even by comparing distances in double: the truncation toward zero and
// the next bf16 away from zero (2^128 stands for the step past the largest finite bf16,
// which IEEE rounding sends to infinity), the nearer one, the even one on a tie.
uint16_t bf16_by_distance(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t lo = bits & 0xffff0000u, hi = lo + 0x10000u;
  const double vf = std::fabs(double(f));
  const double vlo = std::fabs(double(std::bit_cast<float>(lo)));
  const double vhi = (hi & 0x7fffffffu) == 0x7f800000u
                         ? std::ldexp(1.0, 128)
                         : std::fabs(double(std::bit_cast<float>(hi)));
  const double dlo = vf - vlo, dhi = vhi - vf;
  const uint32_t pick = dlo < dhi ? lo : dhi < dlo ? hi : ((lo >> 16) & 1u ? hi : lo);
  return uint16_t(pick >> 16);
}

TEST(KernelMath, Bf16RoundsToNearestEven) {
  // Ties: 1 + 2^-8 is half-way between 1 (even) and 1 + 2^-7: down. 1 + 3·2^-8 is half-way
  // between 1 + 2^-7 (odd) and 1 + 2^-6: up. The same with the sign flipped.
  EXPECT_EQ(km::bf16_from_float(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(km::bf16_from_float(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(km::bf16_from_float(-(1.0f + 0x1p-8f)), 0xbf80);
  EXPECT_EQ(km::bf16_from_float(-(1.0f + 3 * 0x1p-8f)), 0xbf82);
  EXPECT_EQ(km::bf16_from_float(1.0f + 0x1p-8f + 0x1p-23f), 0x3f81);  // just above half: up
  EXPECT_EQ(km::bf16_from_float(1.0f + 0x1p-8f - 0x1p-23f), 0x3f80);  // just below: down
  // A tie that carries into the exponent: 2 − 2^-8 is half-way between 2 − 2^-7 (odd) and 2.
  EXPECT_EQ(km::bf16_from_float(2.0f - 0x1p-8f), 0x4000);
  // Signed zeros and subnormals keep their bits; the smallest subnormals round like any
  // other value (0x00008000 is a tie to the even 0).
  EXPECT_EQ(km::bf16_from_float(0.0f), 0x0000);
  EXPECT_EQ(km::bf16_from_float(-0.0f), 0x8000);
  EXPECT_EQ(km::bf16_from_float(0x1p-130f), 0x0008);
  EXPECT_EQ(km::bf16_from_float(std::bit_cast<float>(0x00008000u)), 0x0000);
  EXPECT_EQ(km::bf16_from_float(std::bit_cast<float>(0x00018000u)), 0x0002);

  // Infinities stay; the largest floats overflow to infinity as IEEE rounding does: the
  // largest finite bf16 is 0x7f7f, and anything from half-way above it (a tie to the even
  // 0x7f80, infinity) rounds up.
  EXPECT_EQ(km::bf16_from_float(kInf), 0x7f80);
  EXPECT_EQ(km::bf16_from_float(-kInf), 0xff80);
  EXPECT_EQ(km::bf16_from_float(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(km::bf16_from_float(-std::numeric_limits<float>::max()), 0xff80);
  EXPECT_EQ(km::bf16_from_float(std::bit_cast<float>(0x7f7f7fffu)), 0x7f7f);
  EXPECT_EQ(km::bf16_from_float(std::bit_cast<float>(0x7f7f8000u)), 0x7f80);

  // NaN stays NaN, quiet, with its sign — also a signalling NaN whose payload lies only in
  // the low 16 bits, which truncation would turn into infinity.
  for (uint32_t nan :
       {0x7fc00000u, 0x7f800001u, 0x7fbfffffu, 0x7fffffffu, 0xffc00000u, 0xff800001u}) {
    const uint16_t h = km::bf16_from_float(std::bit_cast<float>(nan));
    EXPECT_TRUE(std::isnan(km::bf16_to_float(h))) << std::hex << nan;
    EXPECT_EQ(h & 0x0040u, 0x0040u) << std::hex << nan;                // quiet
    EXPECT_EQ(h & 0x8000u, (nan >> 16) & 0x8000u) << std::hex << nan;  // sign
  }

  // Every bf16 converts to float and back unchanged (NaNs: to a NaN).
  for (uint32_t h = 0; h < 0x10000u; ++h) {
    const float f = km::bf16_to_float(uint16_t(h));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), h << 16);
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(km::bf16_to_float(km::bf16_from_float(f))));
    else
      ASSERT_EQ(km::bf16_from_float(f), h) << std::hex << h;
  }

  // Random finite floats of every exponent, and every tie pattern's neighbours, against the
  // rounding decided by distance.
  std::mt19937 rng(37);
  for (int i = 0; i < 1000000; ++i) {
    uint32_t bits = uint32_t(rng());
    if (i % 4 == 1) bits = (bits & 0xffff0000u) | 0x8000u;                 // an exact tie
    if (i % 4 == 2) bits = (bits & 0xffff0000u) | (0x7fffu + (bits & 2));  // next to one
    const float f = std::bit_cast<float>(bits);
    if (std::isnan(f) || std::isinf(f)) continue;
    ASSERT_EQ(km::bf16_from_float(f), bf16_by_distance(f)) << std::hex << bits;
  }
}

}  // namespace
}  // namespace bottle
