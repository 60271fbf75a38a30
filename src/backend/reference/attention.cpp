// Causal GQA attention, the whole score row at a time: q, out [B, S, H, hd]; k, v
// [B, S, Hkv, hd]; lse [B, H, S]. Scores, softmax and gradients in double.
#include <cmath>
#include <vector>

#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

namespace {

struct Dims {
  int64_t B, S, H, Hkv, hd;
  int64_t q_index(int64_t b, int64_t s, int64_t h) const { return ((b * S + s) * H + h) * hd; }
  int64_t kv_index(int64_t b, int64_t s, int64_t h) const { return ((b * S + s) * Hkv + h) * hd; }
};

// score_ij = q_i . k_j / sqrt(hd) for query head h (kv head h / (H / Hkv)), in double.
double attention_score(const Dims& d, const Tensor& q, const Tensor& k, int64_t b, int64_t h,
                       int64_t i, int64_t j) {
  const float* qi = q.f32() + d.q_index(b, i, h);
  const float* kj = k.f32() + d.kv_index(b, j, h / (d.H / d.Hkv));
  double s = 0.0;
  for (int64_t e = 0; e < d.hd; ++e) s += double(qi[e]) * kj[e];
  return s / std::sqrt(double(d.hd));
}

Dims attention_dims(const char* kernel, const Tensor& q, const Tensor& k, const Tensor& v) {
  BOTTLE_CHECK(q.shape.rank == 4 && k.shape.rank == 4 && v.shape.rank == 4,
               "reference backend: {}: q, k, v must be rank 4, got {} {} {}", kernel, q.shape.str(),
               k.shape.str(), v.shape.str());
  Dims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
  BOTTLE_CHECK(k.shape == v.shape && k.shape[0] == d.B && k.shape[1] == d.S && k.shape[3] == d.hd &&
                   d.Hkv > 0 && d.H % d.Hkv == 0,
               "reference backend: {}: bad shapes q {} k {} v {}", kernel, q.shape.str(),
               k.shape.str(), v.shape.str());
  return d;
}

}  // namespace

void ReferenceBackend::do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  const char* kn = "attention_forward";
  need_f32(kn, {out, lse, q, k, v});
  const Dims d = attention_dims(kn, q, k, v);
  need_numel(kn, out, q.numel(), "out");
  need_numel(kn, lse, d.B * d.H * d.S, "lse");
  std::vector<double> p(d.S);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t kvh = h / (d.H / d.Hkv);
      for (int64_t i = 0; i < d.S; ++i) {
        double max_score = -INFINITY;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = attention_score(d, q, k, b, h, i, j);
          if (p[j] > max_score) max_score = p[j];
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(p[j] - max_score);
          sum += p[j];
        }
        for (int64_t j = 0; j <= i; ++j) p[j] /= sum;
        lse.f32()[(b * d.H + h) * d.S + i] = float(max_score + std::log(sum));
        float* oi = out.f32() + d.q_index(b, i, h);
        for (int64_t e = 0; e < d.hd; ++e) {
          double acc = 0.0;
          for (int64_t j = 0; j <= i; ++j) acc += p[j] * v.f32()[d.kv_index(b, j, kvh) + e];
          oi[e] = float(acc);
        }
      }
    }
  }
}

// Recomputes P from lse; D_i = sum_j P_ij dP_ij is taken from P and v (not from `out`), so
// the oracle does not depend on the forward output's rounding.
void ReferenceBackend::do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout,
                                             Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  const char* kn = "attention_backward";
  need_f32(kn, {dq, dk, dv, dout, out, lse, q, k, v});
  const Dims d = attention_dims(kn, q, k, v);
  need_numel(kn, dq, q.numel(), "dq");
  need_numel(kn, dk, k.numel(), "dk");
  need_numel(kn, dv, v.numel(), "dv");
  need_numel(kn, dout, q.numel(), "dout");
  need_numel(kn, out, q.numel(), "out");
  need_numel(kn, lse, d.B * d.H * d.S, "lse");
  const double scale = 1.0 / std::sqrt(double(d.hd));
  // Sum in double, add into the caller's gradients at the end.
  std::vector<double> gq(q.numel(), 0.0), gk(k.numel(), 0.0), gv(v.numel(), 0.0);
  std::vector<double> p(d.S), dp(d.S), ds(d.S);
  for (int64_t b = 0; b < d.B; ++b) {
    for (int64_t h = 0; h < d.H; ++h) {
      const int64_t kvh = h / (d.H / d.Hkv);
      for (int64_t i = 0; i < d.S; ++i) {
        const double lse_i = lse.f32()[(b * d.H + h) * d.S + i];
        const float* doi = dout.f32() + d.q_index(b, i, h);
        const float* qi = q.f32() + d.q_index(b, i, h);
        // P[j] = exp(score_ij - lse_i); dP[j] = dout_i . v_j;
        // dS[j] = P[j] * (dP[j] - sum_l P[l] dP[l]).
        double row_dot = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          p[j] = std::exp(attention_score(d, q, k, b, h, i, j) - lse_i);
          const float* vj = v.f32() + d.kv_index(b, j, kvh);
          double s = 0.0;
          for (int64_t e = 0; e < d.hd; ++e) s += double(doi[e]) * vj[e];
          dp[j] = s;
          row_dot += p[j] * s;
        }
        for (int64_t j = 0; j <= i; ++j) ds[j] = p[j] * (dp[j] - row_dot);
        for (int64_t j = 0; j <= i; ++j) {
          const int64_t kv = d.kv_index(b, j, kvh);
          for (int64_t e = 0; e < d.hd; ++e) {
            gq[d.q_index(b, i, h) + e] += scale * ds[j] * k.f32()[kv + e];
            gk[kv + e] += scale * ds[j] * qi[e];
            gv[kv + e] += p[j] * doi[e];
          }
        }
      }
    }
  }
  for (int64_t i = 0; i < q.numel(); ++i) dq.f32()[i] = float(gq[i]);
  for (int64_t i = 0; i < k.numel(); ++i) dk.f32()[i] = float(gk[i]);
  for (int64_t i = 0; i < v.numel(); ++i) dv.f32()[i] = float(gv[i]);
}

}  // namespace bottle
