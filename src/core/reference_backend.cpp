// Naive, single-threaded kernels: clarity over speed. Sums accumulate in double. Only f32
// float tensors and i32 token/target tensors are supported.
#include "core/reference_backend.h"

#include <cmath>
#include <string_view>
#include <vector>

#include "core/bf16.h"
#include "core/host_backend.h"

namespace bottle {
namespace {

void need_dtype(std::string_view kernel, const Tensor& t, DType want) {
  if (t.dtype != want) {
    fail("reference backend: {} does not support dtype {}", kernel, dtype_name(t.dtype));
  }
  BOTTLE_CHECK(t.data != nullptr || t.numel() == 0, "reference backend: {}: null tensor data",
               kernel);
}

void need_f32(std::string_view kernel, std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts) need_dtype(kernel, t, DType::f32);
}

void need_numel(std::string_view kernel, const Tensor& t, int64_t n, const char* what) {
  BOTTLE_CHECK(t.numel() == n, "reference backend: {}: {} has {} elements {}, expected {}", kernel,
               what, t.numel(), t.shape.str(), n);
}

// out = x * weight / sqrt(Σx²/C + eps) per row; keeps rstd and/or Σx² where given.
void rmsnorm_rows(const char* k, Tensor out, Tensor rstd, Tensor sumsq, Tensor x, Tensor weight,
                  float eps) {
  need_f32(k, {out, x, weight});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, out, n * c, "out");
  need_numel(k, weight, c, "weight");
  if (!rstd.empty()) need_numel(k, rstd, n, "rstd");
  if (!sumsq.empty()) need_numel(k, sumsq, n, "sumsq");
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    double ss = 0.0;
    for (int64_t j = 0; j < c; ++j) ss += double(xr[j]) * xr[j];
    const double rs = 1.0 / std::sqrt(ss / double(c) + eps);
    if (!rstd.empty()) rstd.f32()[r] = float(rs);
    if (!sumsq.empty()) sumsq.f32()[r] = float(ss);
    for (int64_t j = 0; j < c; ++j) out.f32()[r * c + j] = float(xr[j] * rs * weight.f32()[j]);
  }
}

// y_j = x_j * rs * w_j over a row of d columns, of which x holds C; d rs / d x_j =
// -rs^3 x_j / d. dot[r] = Σ over the d columns of g w x: given, or (C = d) from the row.
void rmsnorm_backward_rows(const char* k, Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                           Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  need_f32(k, {dx, dweight, dout, x, weight, rstd});
  const int64_t n = x.rows(), c = x.cols();
  need_numel(k, dx, n * c, "dx");
  need_numel(k, dout, n * c, "dout");
  need_numel(k, dweight, c, "dweight");
  need_numel(k, weight, c, "weight");
  need_numel(k, rstd, n, "rstd");
  if (!dot.empty()) need_numel(k, dot, n, "dot");
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.f32() + r * c;
    const float* gr = dout.f32() + r * c;
    const double rs = rstd.f32()[r];
    double row_dot = 0.0;
    if (dot.empty())
      for (int64_t j = 0; j < c; ++j) row_dot += double(gr[j]) * weight.f32()[j] * xr[j];
    else
      row_dot = dot.f32()[r];
    const double kk = rs * rs * rs * row_dot / double(d);
    for (int64_t j = 0; j < c; ++j) {
      dx.f32()[r * c + j] += float(double(gr[j]) * weight.f32()[j] * rs - xr[j] * kk);
      dweight.f32()[j] += float(double(gr[j]) * xr[j] * rs);
    }
  }
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

class ReferenceBackend final : public HostBackend {
 public:
  std::string_view name() const override { return "reference"; }

  void do_gemm(const GemmArgs& g) override {
    if (g.any_bf16()) fail("reference backend: {} does not support dtype {}", "gemm", "bf16");
    BOTTLE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 0,
                 "reference backend: gemm: negative size m={} n={} k={} batch={}", g.m, g.n, g.k,
                 g.batch);
    BOTTLE_CHECK(
        g.lda >= (g.trans_a ? g.m : g.k) && g.ldb >= (g.trans_b ? g.k : g.n) && g.ldc >= g.n,
        "reference backend: gemm: leading dimension too small (lda={} ldb={} ldc={})", g.lda, g.ldb,
        g.ldc);
    const float* a = static_cast<const float*>(g.a);
    const float* b = static_cast<const float*>(g.b);
    float* c = static_cast<float*>(g.c);
    for (int64_t i = 0; i < g.batch; ++i) {
      const float* ai = a + i * g.stride_a;
      const float* bi = b + i * g.stride_b;
      float* ci = c + i * g.stride_c;
      for (int64_t r = 0; r < g.m; ++r) {
        for (int64_t col = 0; col < g.n; ++col) {
          double sum = 0.0;
          for (int64_t p = 0; p < g.k; ++p) {
            const double av = g.trans_a ? ai[p * g.lda + r] : ai[r * g.lda + p];
            const double bv = g.trans_b ? bi[col * g.ldb + p] : bi[p * g.ldb + col];
            sum += av * bv;
          }
          float& out = ci[r * g.ldc + col];
          double value = double(g.alpha) * sum;
          if (g.beta != 0.0f) value += double(g.beta) * double(out);  // beta == 0: ignore C
          out = float(value);
        }
      }
    }
  }

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) override {
    const char* k = "embedding_forward";
    need_f32(k, {out, table});
    need_dtype(k, tokens, DType::i32);
    const int64_t n = tokens.numel(), vocab = table.rows(), c = table.cols();
    need_numel(k, out, n * c, "out");
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = tokens.i32()[t];
      BOTTLE_CHECK(id >= 0 && id < vocab, "reference backend: {}: token {} out of range [0, {})", k,
                   id, vocab);
      for (int64_t j = 0; j < c; ++j) out.f32()[t * c + j] = table.f32()[id * c + j];
    }
  }

  void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override {
    const char* k = "embedding_backward";
    need_f32(k, {dtable, dout});
    need_dtype(k, tokens, DType::i32);
    const int64_t n = tokens.numel(), vocab = dtable.rows(), c = dtable.cols();
    need_numel(k, dout, n * c, "dout");
    for (int64_t t = 0; t < n; ++t) {
      const int32_t id = tokens.i32()[t];
      BOTTLE_CHECK(id >= 0 && id < vocab, "reference backend: {}: token {} out of range [0, {})", k,
                   id, vocab);
      for (int64_t j = 0; j < c; ++j) dtable.f32()[id * c + j] += dout.f32()[t * c + j];
    }
  }

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override {
    rmsnorm_rows("rmsnorm_forward", out, rstd, Tensor{}, x, weight, eps);
  }

  // The oracle composes the two ops it fuses.
  void do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x, Tensor residual,
                                   Tensor weight, float eps) override {
    add(sum, x, residual);
    rmsnorm_forward(out, rstd, sum, weight, eps);
  }

  void do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                float eps) override {
    rmsnorm_rows("rmsnorm_shard_forward", out, Tensor{}, sumsq, x, weight, eps);
  }

  void do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                           Tensor rstd) override {
    rmsnorm_backward_rows("rmsnorm_backward", dx, dweight, dout, x, weight, rstd, Tensor{},
                          x.cols());
  }

  void do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                                 Tensor rstd, Tensor dot, int64_t d) override {
    rmsnorm_backward_rows("rmsnorm_shard_backward", dx, dweight, dout, x, weight, rstd, dot, d);
  }

  void do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                            Tensor bias, float eps) override {
    const char* k = "layernorm_forward";
    need_f32(k, {out, mean, rstd, x, weight, bias});
    const int64_t n = x.rows(), c = x.cols();
    need_numel(k, out, n * c, "out");
    need_numel(k, mean, n, "mean");
    need_numel(k, rstd, n, "rstd");
    need_numel(k, weight, c, "weight");
    need_numel(k, bias, c, "bias");
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.f32() + r * c;
      double mu = 0.0;
      for (int64_t j = 0; j < c; ++j) mu += xr[j];
      mu /= double(c);
      double var = 0.0;  // biased
      for (int64_t j = 0; j < c; ++j) var += (xr[j] - mu) * (xr[j] - mu);
      var /= double(c);
      const double rs = 1.0 / std::sqrt(var + eps);
      mean.f32()[r] = float(mu);
      rstd.f32()[r] = float(rs);
      for (int64_t j = 0; j < c; ++j) {
        out.f32()[r * c + j] = float((xr[j] - mu) * rs * weight.f32()[j] + bias.f32()[j]);
      }
    }
  }

  void do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                             Tensor weight, Tensor mean, Tensor rstd) override {
    const char* k = "layernorm_backward";
    need_f32(k, {dx, dweight, dbias, dout, x, weight, mean, rstd});
    const int64_t n = x.rows(), c = x.cols();
    need_numel(k, dx, n * c, "dx");
    need_numel(k, dout, n * c, "dout");
    need_numel(k, dweight, c, "dweight");
    need_numel(k, dbias, c, "dbias");
    need_numel(k, weight, c, "weight");
    need_numel(k, mean, n, "mean");
    need_numel(k, rstd, n, "rstd");
    for (int64_t r = 0; r < n; ++r) {
      const float* xr = x.f32() + r * c;
      const float* gr = dout.f32() + r * c;
      const double mu = mean.f32()[r], rs = rstd.f32()[r];
      // xhat = (x - mu) * rs; dxhat = g * w;
      // dx = rs * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)).
      double mean_dxhat = 0.0, mean_dxhat_xhat = 0.0;
      for (int64_t j = 0; j < c; ++j) {
        const double xhat = (xr[j] - mu) * rs;
        const double dxhat = double(gr[j]) * weight.f32()[j];
        mean_dxhat += dxhat;
        mean_dxhat_xhat += dxhat * xhat;
      }
      mean_dxhat /= double(c);
      mean_dxhat_xhat /= double(c);
      for (int64_t j = 0; j < c; ++j) {
        const double xhat = (xr[j] - mu) * rs;
        const double dxhat = double(gr[j]) * weight.f32()[j];
        dx.f32()[r * c + j] += float(rs * (dxhat - mean_dxhat - xhat * mean_dxhat_xhat));
        dweight.f32()[j] += float(gr[j] * xhat);
        dbias.f32()[j] += gr[j];
      }
    }
  }

  void do_rope_forward(Tensor x, float theta) override { rope(x, theta, +1.0, "rope_forward"); }
  void do_rope_backward(Tensor dx, float theta) override { rope(dx, theta, -1.0, "rope_backward"); }

  void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override {
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
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                             Tensor q, Tensor k, Tensor v) override {
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
    for (int64_t i = 0; i < q.numel(); ++i) dq.f32()[i] += float(gq[i]);
    for (int64_t i = 0; i < k.numel(); ++i) dk.f32()[i] += float(gk[i]);
    for (int64_t i = 0; i < v.numel(); ++i) dv.f32()[i] += float(gv[i]);
  }

  void do_silu_forward(Tensor out, Tensor x) override {
    const char* k = "silu_forward";
    need_f32(k, {out, x});
    need_numel(k, out, x.numel(), "out");
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double xv = x.f32()[i];
      out.f32()[i] = float(xv * sigmoid(xv));
    }
  }

  void do_silu_backward(Tensor dx, Tensor dout, Tensor x) override {
    const char* k = "silu_backward";
    need_f32(k, {dx, dout, x});
    need_numel(k, dx, x.numel(), "dx");
    need_numel(k, dout, x.numel(), "dout");
    for (int64_t i = 0; i < x.numel(); ++i) {
      const double xv = x.f32()[i], s = sigmoid(xv);
      dx.f32()[i] += float(dout.f32()[i] * s * (1.0 + xv * (1.0 - s)));
    }
  }

  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override {
    const char* k = "swiglu_forward";
    need_f32(k, {out, gate, up});
    need_numel(k, up, gate.numel(), "up");
    need_numel(k, out, gate.numel(), "out");
    for (int64_t i = 0; i < gate.numel(); ++i) {
      const double g = gate.f32()[i];
      const double act = gate_act ? g * sigmoid(g) : g;
      out.f32()[i] = float(act * up.f32()[i]);
    }
  }

  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                          bool gate_act) override {
    const char* k = "swiglu_backward";
    need_f32(k, {dgate, dup, dout, gate, up});
    need_numel(k, up, gate.numel(), "up");
    need_numel(k, dgate, gate.numel(), "dgate");
    need_numel(k, dup, gate.numel(), "dup");
    need_numel(k, dout, gate.numel(), "dout");
    for (int64_t i = 0; i < gate.numel(); ++i) {
      const double g = gate.f32()[i], s = sigmoid(g);
      const double act = gate_act ? g * s : g;
      const double dact = gate_act ? s * (1.0 + g * (1.0 - s)) : 1.0;
      const double go = dout.f32()[i];
      dgate.f32()[i] += float(go * up.f32()[i] * dact);
      dup.f32()[i] += float(go * act);
    }
  }

  void do_add(Tensor out, Tensor a, Tensor b) override {
    const char* k = "add";
    need_f32(k, {out, a, b});
    need_numel(k, b, a.numel(), "b");
    need_numel(k, out, a.numel(), "out");
    for (int64_t i = 0; i < a.numel(); ++i) out.f32()[i] = a.f32()[i] + b.f32()[i];
  }

  void do_copy(Tensor dst, Tensor src) override {
    if (copy_scalars(dst, src)) return;
    BOTTLE_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(),
                 "reference backend: copy of {} {} into {} {}", dtype_name(src.dtype),
                 src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
    const size_t size = dtype_size(dst.dtype);
    const auto* s = static_cast<const unsigned char*>(src.data);
    auto* o = static_cast<unsigned char*>(dst.data);
    for (size_t i = 0; i < src.nbytes(); i += size)
      for (size_t b = 0; b < size; ++b) o[i + b] = s[i + b];
  }

  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override {
    check_copy_columns("reference", dst, dst_col, src, src_col, cols);
    const int64_t size = int64_t(dtype_size(dst.dtype));
    const auto* s = static_cast<const unsigned char*>(src.data);
    auto* o = static_cast<unsigned char*>(dst.data);
    for (int64_t i = 0; i < dst.rows(); ++i)
      for (int64_t j = 0; j < cols; ++j)
        for (int64_t b = 0; b < size; ++b)
          o[((i * dst.cols()) + dst_col + j) * size + b] =
              s[((i * src.cols()) + src_col + j) * size + b];
  }

  int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) override {
    need_dtype("first_outside", ids, DType::i32);
    for (int64_t i = 0; i < ids.numel(); ++i)
      if (ids.i32()[i] < lo || ids.i32()[i] >= hi) return i;
    return -1;
  }

  double do_sum(Tensor x) override {
    need_f32("sum", {x});
    double s = 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) s += x.f32()[i];
    return s;
  }

  void do_multiply(Tensor out, Tensor a, Tensor b) override {
    need_f32("multiply", {out, a, b});
    for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] = a.f32()[i] * b.f32()[i];
  }

  void do_divide(Tensor out, Tensor a, Tensor b) override {
    need_f32("divide", {out, a, b});
    for (int64_t i = 0; i < out.numel(); ++i) out.f32()[i] = a.f32()[i] / b.f32()[i];
  }

  void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                               bool reciprocal) override {
    need_f32("rms_from_sum_squares", {out, sumsq});
    for (int64_t i = 0; i < out.numel(); ++i) {
      const double rms = std::sqrt(double(sumsq.f32()[i]) / double(count) + double(eps));
      out.f32()[i] = float(reciprocal ? 1.0 / rms : rms);
    }
  }

  void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                       Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                       int64_t first) override {
    const char* k = "cross_entropy_shard_partials";
    need_f32(k, {sumexp, target_logit, local_sumexp, local_max, max, logits});
    need_dtype(k, targets, DType::i32);
    const int64_t v = logits.cols();
    for (int64_t i = 0; i < logits.rows(); ++i) {
      sumexp.f32()[i] = float(double(local_sumexp.f32()[i]) *
                              std::exp(double(local_max.f32()[i]) - double(max.f32()[i])));
      const int64_t t = int64_t(targets.i32()[i]) - first;
      target_logit.f32()[i] = t >= 0 && t < v ? logits.f32()[i * v + t] : 0.0f;
    }
  }

  void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                     Tensor max) override {
    need_f32("cross_entropy_shard_losses", {losses, sumexp, target_logit, max});
    for (int64_t i = 0; i < losses.numel(); ++i)
      losses.f32()[i] = float(std::log(double(sumexp.f32()[i])) + double(max.f32()[i]) -
                              double(target_logit.f32()[i]));
  }

  void do_accumulate(Tensor dst, Tensor src) override {
    const char* k = "accumulate";
    need_f32(k, {dst, src});
    need_numel(k, src, dst.numel(), "src");
    for (int64_t i = 0; i < dst.numel(); ++i) dst.f32()[i] += src.f32()[i];
  }

  void do_fill_zero(Tensor x) override {
    if (x.dtype == DType::f64) {
      for (int64_t i = 0; i < x.numel(); ++i) static_cast<double*>(x.data)[i] = 0.0;
      return;
    }
    need_f32("fill_zero", {x});
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = 0.0f;
  }

  void do_scale(Tensor x, float factor) override {
    need_f32("scale", {x});
    for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = x.f32()[i] * factor;
  }

  double do_sum_squares(Tensor x) override {
    need_f32("sum_squares", {x});
    double s = 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) s += double(x.f32()[i]) * x.f32()[i];
    return s;
  }

  void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                Tensor targets) override {
    const char* k = "cross_entropy_forward";
    need_f32(k, {losses, probs, logits});
    need_dtype(k, targets, DType::i32);
    const int64_t n = logits.rows(), vocab = logits.cols();
    need_numel(k, targets, n, "targets");
    need_numel(k, losses, n, "losses");
    need_numel(k, probs, n * vocab, "probs");
    for (int64_t r = 0; r < n; ++r) {
      const float* lr = logits.f32() + r * vocab;
      const int32_t t = targets.i32()[r];
      BOTTLE_CHECK(t >= 0 && t < vocab, "reference backend: {}: target {} out of range [0, {})", k,
                   t, vocab);
      double mx = -INFINITY;
      for (int64_t j = 0; j < vocab; ++j) mx = lr[j] > mx ? lr[j] : mx;
      double sum = 0.0;
      for (int64_t j = 0; j < vocab; ++j) sum += std::exp(lr[j] - mx);
      const double lse = mx + std::log(sum);
      losses.f32()[r] = float(lse - lr[t]);
      for (int64_t j = 0; j < vocab; ++j) probs.f32()[r * vocab + j] = float(std::exp(lr[j] - lse));
    }
  }

  void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                 float scale) override {
    const char* k = "cross_entropy_backward";
    need_f32(k, {dlogits, probs});
    need_dtype(k, targets, DType::i32);
    const int64_t n = probs.rows(), vocab = probs.cols();
    need_numel(k, targets, n, "targets");
    need_numel(k, dlogits, n * vocab, "dlogits");
    for (int64_t r = 0; r < n; ++r) {
      const int32_t t = targets.i32()[r];
      BOTTLE_CHECK(t >= 0 && t < vocab, "reference backend: {}: target {} out of range [0, {})", k,
                   t, vocab);
      for (int64_t j = 0; j < vocab; ++j) {
        const double onehot = j == t ? 1.0 : 0.0;
        dlogits.f32()[r * vocab + j] +=
            float(double(scale) * (probs.f32()[r * vocab + j] - onehot));
      }
    }
  }

  void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override {
    const char* k = "embedding_shard_forward";
    need_f32(k, {out, table});
    need_dtype(k, tokens, DType::i32);
    const int64_t n = tokens.numel(), rows = table.rows(), c = table.cols();
    need_numel(k, out, n * c, "out");
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = int64_t(tokens.i32()[t]) - first;
      const bool here = row >= 0 && row < rows;
      for (int64_t j = 0; j < c; ++j) out.f32()[t * c + j] = here ? table.f32()[row * c + j] : 0.0f;
    }
  }

  void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                   int64_t first) override {
    const char* k = "embedding_shard_backward";
    need_f32(k, {dtable, dout});
    need_dtype(k, tokens, DType::i32);
    const int64_t n = tokens.numel(), rows = dtable.rows(), c = dtable.cols();
    need_numel(k, dout, n * c, "dout");
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = int64_t(tokens.i32()[t]) - first;
      if (row < 0 || row >= rows) continue;
      for (int64_t j = 0; j < c; ++j) dtable.f32()[row * c + j] += dout.f32()[t * c + j];
    }
  }

  void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override {
    const char* k = "logits_row_stats";
    need_f32(k, {max, sumexp, logits});
    const int64_t n = logits.rows(), v = logits.cols();
    need_numel(k, max, n, "max");
    need_numel(k, sumexp, n, "sumexp");
    for (int64_t r = 0; r < n; ++r) {
      const float* lr = logits.f32() + r * v;
      // A NaN logit makes the row's max NaN (a plain comparison would skip it).
      double mx = -INFINITY;
      for (int64_t j = 0; j < v; ++j) mx = lr[j] > mx || std::isnan(lr[j]) ? lr[j] : mx;
      double sum = 0.0;
      for (int64_t j = 0; j < v; ++j) sum += std::exp(lr[j] - mx);
      max.f32()[r] = float(mx);
      sumexp.f32()[r] = float(sum);
    }
  }

  void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                       Tensor targets, int64_t first, float scale) override {
    const char* k = "cross_entropy_shard_backward";
    need_f32(k, {dlogits, logits, max, sumexp});
    need_dtype(k, targets, DType::i32);
    const int64_t n = logits.rows(), v = logits.cols();
    need_numel(k, dlogits, n * v, "dlogits");
    need_numel(k, targets, n, "targets");
    for (int64_t r = 0; r < n; ++r) {
      const int64_t target = int64_t(targets.i32()[r]) - first;
      for (int64_t j = 0; j < v; ++j) {
        const double p = std::exp(double(logits.f32()[r * v + j]) - max.f32()[r]) / sumexp.f32()[r];
        dlogits.f32()[r * v + j] += float(double(scale) * (p - (j == target ? 1.0 : 0.0)));
      }
    }
  }

  void do_scale_rows(Tensor out, Tensor x, Tensor factor) override {
    const char* k = "scale_rows";
    need_f32(k, {out, x, factor});
    const int64_t n = x.rows(), c = x.cols();
    need_numel(k, out, n * c, "out");
    need_numel(k, factor, n, "factor");
    for (int64_t r = 0; r < n; ++r)
      for (int64_t j = 0; j < c; ++j)
        out.f32()[r * c + j] = float(double(x.f32()[r * c + j]) * factor.f32()[r]);
  }

  void do_row_dot(Tensor out, Tensor a, Tensor b) override {
    const char* k = "row_dot";
    need_f32(k, {out, a, b});
    const int64_t n = a.rows(), c = a.cols();
    need_numel(k, b, n * c, "b");
    need_numel(k, out, n, "out");
    for (int64_t r = 0; r < n; ++r) {
      double s = 0.0;
      for (int64_t j = 0; j < c; ++j) s += double(a.f32()[r * c + j]) * b.f32()[r * c + j];
      out.f32()[r] = float(s);
    }
  }

  void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                       Tensor control, const AdamWArgs& a) override {
    if (!control.empty() && control.f32()[kControlApply] == 0.0f) return;
    const double scale = control.empty() ? a.grad_scale : control.f32()[kControlScale];
    const double b1 = a.beta1, b2 = a.beta2;
    const double c1 = 1.0 - std::pow(b1, double(a.step));
    const double c2 = 1.0 - std::pow(b2, double(a.step));
    size_t range = 0;  // the first no-decay range not yet passed
    for (int64_t i = 0; i < param.numel(); ++i) {
      while (range < a.no_decay.size() && i >= a.no_decay[range].offset + a.no_decay[range].count)
        ++range;
      const bool decays = range == a.no_decay.size() || i < a.no_decay[range].offset;
      const double g = double(grad.f32()[i]) * scale;
      const double mi = b1 * m.f32()[i] + (1.0 - b1) * g;
      const double vi = b2 * v.f32()[i] + (1.0 - b2) * g * g;
      m.f32()[i] = float(mi);
      v.f32()[i] = float(vi);
      const double mhat = mi / c1, vhat = vi / c2;
      const double p = param.f32()[i], wd = decays ? double(a.weight_decay) : 0.0;
      param.f32()[i] = float(p - double(a.lr) * (mhat / (std::sqrt(vhat) + a.eps) + wd * p));
      if (compute.empty()) continue;
      if (compute.dtype == DType::bf16)
        compute.bf16()[i] = bf16_from_float(param.f32()[i]);
      else
        compute.f32()[i] = param.f32()[i];
    }
  }

 private:
  struct Dims {
    int64_t B, S, H, Hkv, hd;
    int64_t q_index(int64_t b, int64_t s, int64_t h) const { return ((b * S + s) * H + h) * hd; }
    int64_t kv_index(int64_t b, int64_t s, int64_t h) const { return ((b * S + s) * Hkv + h) * hd; }
  };

  // score_ij = q_i . k_j / sqrt(hd) for query head h (kv head h / (H / Hkv)), in double.
  static double attention_score(const Dims& d, const Tensor& q, const Tensor& k, int64_t b,
                                int64_t h, int64_t i, int64_t j) {
    const float* qi = q.f32() + d.q_index(b, i, h);
    const float* kj = k.f32() + d.kv_index(b, j, h / (d.H / d.Hkv));
    double s = 0.0;
    for (int64_t e = 0; e < d.hd; ++e) s += double(qi[e]) * kj[e];
    return s / std::sqrt(double(d.hd));
  }

  static Dims attention_dims(const char* kernel, const Tensor& q, const Tensor& k,
                             const Tensor& v) {
    BOTTLE_CHECK(q.shape.rank == 4 && k.shape.rank == 4 && v.shape.rank == 4,
                 "reference backend: {}: q, k, v must be rank 4, got {} {} {}", kernel,
                 q.shape.str(), k.shape.str(), v.shape.str());
    Dims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3]};
    BOTTLE_CHECK(k.shape == v.shape && k.shape[0] == d.B && k.shape[1] == d.S &&
                     k.shape[3] == d.hd && d.Hkv > 0 && d.H % d.Hkv == 0,
                 "reference backend: {}: bad shapes q {} k {} v {}", kernel, q.shape.str(),
                 k.shape.str(), v.shape.str());
    return d;
  }

  // sign = +1 rotates by +angle (forward), -1 by -angle (backward, the inverse).
  static void rope(Tensor x, float theta, double sign, const char* kernel) {
    need_f32(kernel, {x});
    BOTTLE_CHECK(x.shape.rank == 4 && x.shape[3] % 2 == 0,
                 "reference backend: {}: x must be [B,S,heads,hd] with even hd, got {}", kernel,
                 x.shape.str());
    const int64_t B = x.shape[0], S = x.shape[1], heads = x.shape[2], hd = x.shape[3];
    const int64_t half = hd / 2;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) {
        for (int64_t h = 0; h < heads; ++h) {
          float* xv = x.f32() + ((b * S + s) * heads + h) * hd;
          for (int64_t i = 0; i < half; ++i) {
            const double inv_freq = std::pow(double(theta), -2.0 * double(i) / double(hd));
            const double angle = sign * double(s) * inv_freq;
            const double c = std::cos(angle), sn = std::sin(angle);
            const double x1 = xv[i], x2 = xv[i + half];
            xv[i] = float(x1 * c - x2 * sn);
            xv[i + half] = float(x2 * c + x1 * sn);
          }
        }
      }
    }
  }
};

}  // namespace

std::unique_ptr<Backend> make_reference_backend() { return std::make_unique<ReferenceBackend>(); }

}  // namespace bottle
