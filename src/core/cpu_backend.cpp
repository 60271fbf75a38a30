// CPU backend: GEMMs on oneDNN (dnnl_gemm.cpp), everything else as OpenMP loops over rows.
// oneDNN's Debian build uses OpenMP too, so there is one thread pool.
#include "core/cpu_backend.h"

#include <omp.h>

#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/arena.h"
#include "core/dnnl_gemm.h"

namespace bottle {
namespace {

void require_f32(const char* kernel, std::initializer_list<Tensor> tensors) {
  for (const Tensor& t : tensors)
    BOTTLE_CHECK(t.dtype == DType::f32, "cpu backend: {} does not support dtype {}", kernel,
                 dtype_name(t.dtype));
}

void require_i32(const char* kernel, const Tensor& t) {
  BOTTLE_CHECK(t.dtype == DType::i32, "cpu backend: {} needs i32 indices, got {}", kernel,
               dtype_name(t.dtype));
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Scratch memory that only grows; accounted as workspace.
class Workspace {
 public:
  ~Workspace() { MemoryStats::global().sub(MemoryTag::workspace, buf_.size() * sizeof(float)); }
  float* get(size_t n) {
    if (n > buf_.size()) {
      MemoryStats::global().sub(MemoryTag::workspace, buf_.size() * sizeof(float));
      buf_.assign(n, 0.0f);
      MemoryStats::global().add(MemoryTag::workspace, n * sizeof(float));
    }
    return buf_.data();
  }

 private:
  std::vector<float> buf_;
};

// cos/sin of every (position, frequency) pair: [S, hd/2] each.
struct RopeTable {
  std::vector<float> cos, sin;
};

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }

  void gemm(const GemmArgs& args) override {
    BOTTLE_CHECK(args.dtype == DType::f32 || args.dtype == DType::bf16,
                 "cpu backend: gemm does not support dtype {}", dtype_name(args.dtype));
    dnnl_gemm(args);
  }

  void embedding_forward(Tensor out, Tensor tokens, Tensor table) override {
    require_f32("embedding_forward", {out, table});
    require_i32("embedding_forward", tokens);
    const int64_t n = tokens.numel(), c = table.cols(), v = table.rows();
    const int32_t* tok = tokens.i32();
    for (int64_t i = 0; i < n; ++i)
      BOTTLE_CHECK(tok[i] >= 0 && tok[i] < v, "token id {} at position {} is outside the vocabulary [0, {})",
                   tok[i], i, v);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out.f32() + i * c, table.f32() + int64_t(tok[i]) * c, c * sizeof(float));
  }

  void embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override {
    require_f32("embedding_backward", {dtable, dout});
    require_i32("embedding_backward", tokens);
    const int64_t n = tokens.numel(), c = dtable.cols();
    const int32_t* tok = tokens.i32();
    // Parallel over columns: rows may repeat, columns never collide.
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t c0 = c * t / nt, c1 = c * (t + 1) / nt;
      for (int64_t i = 0; i < n; ++i) {
        float* dst = dtable.f32() + int64_t(tok[i]) * c;
        const float* src = dout.f32() + i * c;
        for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
      }
    }
  }

  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override {
    require_f32("rmsnorm_forward", {out, rstd, x, weight});
    const int64_t n = x.rows(), c = x.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.f32() + i * c;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < c; ++j) ss += xi[j] * xi[j];
      const float r = 1.0f / std::sqrt(ss / float(c) + eps);
      rstd.f32()[i] = r;
      float* oi = out.f32() + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * r * weight.f32()[j];
    }
  }

  void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                        Tensor rstd) override {
    require_f32("rmsnorm_backward", {dx, dweight, dout, x, weight, rstd});
    const int64_t n = x.rows(), c = x.cols();
    const int nt = omp_get_max_threads();
    float* partial = dweight_ws_.get(size_t(nt) * c);
    std::memset(partial, 0, sizeof(float) * nt * c);
#pragma omp parallel
    {
      float* dw = partial + size_t(omp_get_thread_num()) * c;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x.f32() + i * c;
        const float* gi = dout.f32() + i * c;
        float* dxi = dx.f32() + i * c;
        const float r = rstd.f32()[i];
        float dot = 0.0f;  // sum_j g_j w_j x_j
#pragma omp simd reduction(+ : dot)
        for (int64_t j = 0; j < c; ++j) dot += gi[j] * weight.f32()[j] * xi[j];
        const float k = dot * r * r * r / float(c);
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
          dxi[j] += gi[j] * weight.f32()[j] * r - xi[j] * k;
          dw[j] += gi[j] * xi[j] * r;
        }
      }
    }
    for (int t = 0; t < nt; ++t)
      for (int64_t j = 0; j < c; ++j) dweight.f32()[j] += partial[size_t(t) * c + j];
  }

  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias,
                         float eps) override {
    require_f32("layernorm_forward", {out, mean, rstd, x, weight, bias});
    const int64_t n = x.rows(), c = x.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.f32() + i * c;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) s += xi[j];
      const float mu = s / float(c);
      float v = 0.0f;
#pragma omp simd reduction(+ : v)
      for (int64_t j = 0; j < c; ++j) v += (xi[j] - mu) * (xi[j] - mu);
      const float r = 1.0f / std::sqrt(v / float(c) + eps);
      mean.f32()[i] = mu;
      rstd.f32()[i] = r;
      float* oi = out.f32() + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) oi[j] = (xi[j] - mu) * r * weight.f32()[j] + bias.f32()[j];
    }
  }

  void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                          Tensor weight, Tensor mean, Tensor rstd) override {
    require_f32("layernorm_backward", {dx, dweight, dbias, dout, x, weight, mean, rstd});
    const int64_t n = x.rows(), c = x.cols();
    const int nt = omp_get_max_threads();
    float* partial = dweight_ws_.get(size_t(nt) * 2 * c);
    std::memset(partial, 0, sizeof(float) * nt * 2 * c);
#pragma omp parallel
    {
      float* dw = partial + size_t(omp_get_thread_num()) * 2 * c;
      float* db = dw + c;
#pragma omp for schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float* xi = x.f32() + i * c;
        const float* gi = dout.f32() + i * c;
        float* dxi = dx.f32() + i * c;
        const float mu = mean.f32()[i], r = rstd.f32()[i];
        float sum_g = 0.0f, sum_gx = 0.0f;  // over j of (g w) and (g w) * xhat
#pragma omp simd reduction(+ : sum_g, sum_gx)
        for (int64_t j = 0; j < c; ++j) {
          const float gw = gi[j] * weight.f32()[j];
          sum_g += gw;
          sum_gx += gw * (xi[j] - mu) * r;
        }
        sum_g /= float(c);
        sum_gx /= float(c);
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
          const float xhat = (xi[j] - mu) * r;
          dxi[j] += r * (gi[j] * weight.f32()[j] - sum_g - xhat * sum_gx);
          dw[j] += gi[j] * xhat;
          db[j] += gi[j];
        }
      }
    }
    for (int t = 0; t < nt; ++t)
      for (int64_t j = 0; j < c; ++j) {
        dweight.f32()[j] += partial[size_t(t) * 2 * c + j];
        dbias.f32()[j] += partial[size_t(t) * 2 * c + c + j];
      }
  }

  void rope_forward(Tensor x, float theta) override { rope(x, theta, 1.0f); }
  void rope_backward(Tensor dx, float theta) override { rope(dx, theta, -1.0f); }

  // Attention runs on head-major copies ([B, heads, S, hd]) so that each GEMM is one batched
  // call over (batch, kv head): query head g·rep + r of kv group g is batch entry (b, g)
  // at offset r, with uniform strides.
  void attention_forward(Tensor out, Tensor probs, Tensor q, Tensor k, Tensor v) override {
    require_f32("attention_forward", {out, probs, q, k, v});
    const Dims d = dims(q, k);
    float* qt = ws_q_.get(q.numel());
    float* kt = ws_k_.get(k.numel());
    float* vt = ws_v_.get(v.numel());
    float* ot = ws_o_.get(out.numel());
    to_head_major(qt, q.f32(), d, d.H);
    to_head_major(kt, k.f32(), d, d.Hkv);
    to_head_major(vt, v.f32(), d, d.Hkv);
    const int64_t qs = d.S * d.hd, ss = d.S * d.S, bs = d.S / d.blocks;
    // Causal: query block i only needs keys [0, (i+1)·bs); the skipped scores stay unwritten
    // and the softmax zeroes them.
    for (int64_t r = 0; r < d.rep; ++r)
      for (int64_t i = 0; i < d.blocks; ++i) {
        const int64_t keys = (i + 1) * bs;
        float* p = probs.f32() + r * ss + i * bs * d.S;
        // scores = Q Kᵀ / √hd
        batched(false, true, bs, keys, d.hd, d.scale, qt + r * qs + i * bs * d.hd, d.hd, d.rep * qs, kt, d.hd,
                qs, 0.0f, p, d.S, d.rep * ss, d);
      }
    causal_softmax(probs, d);
    for (int64_t r = 0; r < d.rep; ++r)
      for (int64_t i = 0; i < d.blocks; ++i) {
        const int64_t keys = (i + 1) * bs;
        // out = P V
        batched(false, false, bs, d.hd, keys, 1.0f, probs.f32() + r * ss + i * bs * d.S, d.S, d.rep * ss, vt,
                d.hd, qs, 0.0f, ot + r * qs + i * bs * d.hd, d.hd, d.rep * qs, d);
      }
    from_head_major(out.f32(), ot, d, d.H, /*accumulate=*/false);
  }

  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor probs, Tensor q,
                          Tensor k, Tensor v) override {
    require_f32("attention_backward", {dq, dk, dv, dout, probs, q, k, v});
    const Dims d = dims(q, k);
    float* qt = ws_q_.get(q.numel());
    float* kt = ws_k_.get(k.numel());
    float* vt = ws_v_.get(v.numel());
    float* dot = ws_o_.get(dout.numel());
    float* dqt = ws_dq_.get(q.numel());
    float* dkt = ws_dk_.get(k.numel());
    float* dvt = ws_dv_.get(v.numel());
    float* ds = ws_scores_.get(probs.numel());
    to_head_major(qt, q.f32(), d, d.H);
    to_head_major(kt, k.f32(), d, d.Hkv);
    to_head_major(vt, v.f32(), d, d.Hkv);
    to_head_major(dot, dout.f32(), d, d.H);
    const int64_t qs = d.S * d.hd, ss = d.S * d.S, bs = d.S / d.blocks;
    const float* p = probs.f32();
    std::memset(dkt, 0, sizeof(float) * k.numel());
    std::memset(dvt, 0, sizeof(float) * v.numel());
    for (int64_t r = 0; r < d.rep; ++r)
      for (int64_t i = 0; i < d.blocks; ++i) {
        const int64_t keys = (i + 1) * bs;
        const float* dot_i = dot + r * qs + i * bs * d.hd;
        // dP = dO Vᵀ (only the causal part; the softmax backward zeroes the rest)
        batched(false, true, bs, keys, d.hd, 1.0f, dot_i, d.hd, d.rep * qs, vt, d.hd, qs, 0.0f,
                ds + r * ss + i * bs * d.S, d.S, d.rep * ss, d);
        // dV += Pᵀ dO, summed over the query blocks and the rep heads sharing a kv head
        batched(true, false, keys, d.hd, bs, 1.0f, p + r * ss + i * bs * d.S, d.S, d.rep * ss, dot_i, d.hd,
                d.rep * qs, 1.0f, dvt, d.hd, qs, d);
      }
    // dS = P ⊙ (dP − rowsum(dP ⊙ P)), the softmax backward; entries above the diagonal stay 0
    const int64_t rows = d.B * d.H * d.S;
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t i = row % d.S;
      const float* pr = p + row * d.S;
      float* dr = ds + row * d.S;
      float dot_pd = 0.0f;
#pragma omp simd reduction(+ : dot_pd)
      for (int64_t j = 0; j <= i; ++j) dot_pd += pr[j] * dr[j];
#pragma omp simd
      for (int64_t j = 0; j <= i; ++j) dr[j] = pr[j] * (dr[j] - dot_pd);
      for (int64_t j = i + 1; j < d.S; ++j) dr[j] = 0.0f;
    }
    for (int64_t r = 0; r < d.rep; ++r)
      for (int64_t i = 0; i < d.blocks; ++i) {
        const int64_t keys = (i + 1) * bs;
        const float* ds_i = ds + r * ss + i * bs * d.S;
        // dQ = dS K / √hd;  dK += dSᵀ Q / √hd
        batched(false, false, bs, d.hd, keys, d.scale, ds_i, d.S, d.rep * ss, kt, d.hd, qs, 0.0f,
                dqt + r * qs + i * bs * d.hd, d.hd, d.rep * qs, d);
        batched(true, false, keys, d.hd, bs, d.scale, ds_i, d.S, d.rep * ss, qt + r * qs + i * bs * d.hd, d.hd,
                d.rep * qs, 1.0f, dkt, d.hd, qs, d);
      }
    from_head_major(dq.f32(), dqt, d, d.H, true);
    from_head_major(dk.f32(), dkt, d, d.Hkv, true);
    from_head_major(dv.f32(), dvt, d, d.Hkv, true);
  }

  void silu_forward(Tensor out, Tensor x) override {
    require_f32("silu_forward", {out, x});
    const int64_t n = x.numel();
    const float* xs = x.f32();
    float* os = out.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) os[i] = xs[i] * sigmoid(xs[i]);
  }

  void silu_backward(Tensor dx, Tensor dout, Tensor x) override {
    require_f32("silu_backward", {dx, dout, x});
    const int64_t n = x.numel();
    const float *xs = x.f32(), *gs = dout.f32();
    float* ds = dx.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float s = sigmoid(xs[i]);
      ds[i] += gs[i] * s * (1.0f + xs[i] * (1.0f - s));
    }
  }

  void swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override {
    require_f32("swiglu_forward", {out, gate, up});
    const int64_t n = gate.numel();
    const float *g = gate.f32(), *u = up.f32();
    float* o = out.f32();
    if (gate_act) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = g[i] * sigmoid(g[i]) * u[i];
    } else {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) o[i] = g[i] * u[i];
    }
  }

  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                       bool gate_act) override {
    require_f32("swiglu_backward", {dgate, dup, dout, gate, up});
    const int64_t n = gate.numel();
    const float *g = gate.f32(), *u = up.f32(), *d = dout.f32();
    float *dg = dgate.f32(), *du = dup.f32();
    if (gate_act) {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        const float s = sigmoid(g[i]);
        du[i] += d[i] * g[i] * s;
        dg[i] += d[i] * u[i] * s * (1.0f + g[i] * (1.0f - s));
      }
    } else {
#pragma omp parallel for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) {
        du[i] += d[i] * g[i];
        dg[i] += d[i] * u[i];
      }
    }
  }

  void add(Tensor out, Tensor a, Tensor b) override {
    require_f32("add", {out, a, b});
    const int64_t n = out.numel();
    const float *x = a.f32(), *y = b.f32();
    float* o = out.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] = x[i] + y[i];
  }

  void accumulate(Tensor dst, Tensor src) override {
    require_f32("accumulate", {dst, src});
    const int64_t n = dst.numel();
    const float* s = src.f32();
    float* o = dst.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] += s[i];
  }

  void fill_zero(Tensor x) override { std::memset(x.data, 0, x.nbytes()); }

  void scale(Tensor x, float factor) override {
    require_f32("scale", {x});
    const int64_t n = x.numel();
    float* o = x.f32();
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) o[i] *= factor;
  }

  double sum_squares(Tensor x) override {
    require_f32("sum_squares", {x});
    const int64_t n = x.numel();
    const float* s = x.f32();
    double total = 0.0;
#pragma omp parallel for reduction(+ : total) schedule(static)
    for (int64_t i = 0; i < n; ++i) total += double(s[i]) * s[i];
    return total;
  }

  void cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits, Tensor targets) override {
    require_f32("cross_entropy_forward", {losses, probs, logits});
    require_i32("cross_entropy_forward", targets);
    const int64_t n = logits.rows(), v = logits.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* li = logits.f32() + i * v;
      float* pi = probs.f32() + i * v;
      float mx = li[0];
      for (int64_t j = 1; j < v; ++j) mx = std::max(mx, li[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j < v; ++j) {
        pi[j] = std::exp(li[j] - mx);
        sum += pi[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < v; ++j) pi[j] *= inv;
      const int32_t t = targets.i32()[i];
      losses.f32()[i] = std::log(sum) + mx - li[t];
    }
  }

  void cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets, float scale) override {
    require_f32("cross_entropy_backward", {dlogits, probs});
    require_i32("cross_entropy_backward", targets);
    const int64_t n = probs.rows(), v = probs.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* pi = probs.f32() + i * v;
      float* di = dlogits.f32() + i * v;
      for (int64_t j = 0; j < v; ++j) di[j] += scale * pi[j];
      di[targets.i32()[i]] -= scale;
    }
  }

  void adamw_update(Tensor param, Tensor grad, Tensor m, Tensor v, const AdamWArgs& a) override {
    require_f32("adamw_update", {param, grad, m, v});
    const int64_t n = param.numel();
    float *p = param.f32(), *g = grad.f32(), *ms = m.f32(), *vs = v.f32();
    const float c1 = 1.0f / (1.0f - std::pow(a.beta1, float(a.step)));
    const float c2 = 1.0f / (1.0f - std::pow(a.beta2, float(a.step)));
#pragma omp parallel for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float gi = g[i] * a.grad_scale;
      ms[i] = a.beta1 * ms[i] + (1.0f - a.beta1) * gi;
      vs[i] = a.beta2 * vs[i] + (1.0f - a.beta2) * gi * gi;
      const float update = (ms[i] * c1) / (std::sqrt(vs[i] * c2) + a.eps);
      p[i] -= a.lr * (update + a.weight_decay * p[i]);
    }
  }

 private:
  struct Dims {
    int64_t B, S, H, Hkv, hd, rep;
    float scale;
    int64_t blocks;  // causal query blocks
  };

  static Dims dims(const Tensor& q, const Tensor& k) {
    BOTTLE_CHECK(q.shape.rank == 4 && k.shape.rank == 4, "attention: q and k must be [B,S,heads,hd]");
    Dims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], 0, 0.0f, 1};
    // Up to 8 query blocks of at least 64 rows: fewer skipped scores, fewer GEMM calls.
    for (int64_t nb = std::min<int64_t>(8, d.S / 64); nb > 1; --nb)
      if (d.S % nb == 0) {
        d.blocks = nb;
        break;
      }
    BOTTLE_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0, "attention: {} query heads not divisible by {} kv heads",
                 d.H, d.Hkv);
    d.rep = d.H / d.Hkv;
    d.scale = 1.0f / std::sqrt(float(d.hd));
    return d;
  }
  // [B, S, heads, hd] → [B, heads, S, hd]
  static void to_head_major(float* dst, const float* src, const Dims& d, int64_t heads) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.S; ++s)
        for (int64_t h = 0; h < heads; ++h)
          std::memcpy(dst + ((b * heads + h) * d.S + s) * d.hd, src + ((b * d.S + s) * heads + h) * d.hd,
                      d.hd * sizeof(float));
  }
  // [B, heads, S, hd] → [B, S, heads, hd], written or added.
  static void from_head_major(float* dst, const float* src, const Dims& d, int64_t heads, bool accumulate) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int64_t b = 0; b < d.B; ++b)
      for (int64_t s = 0; s < d.S; ++s)
        for (int64_t h = 0; h < heads; ++h) {
          float* o = dst + ((b * d.S + s) * heads + h) * d.hd;
          const float* i = src + ((b * heads + h) * d.S + s) * d.hd;
          if (accumulate) {
#pragma omp simd
            for (int64_t e = 0; e < d.hd; ++e) o[e] += i[e];
          } else {
            std::memcpy(o, i, d.hd * sizeof(float));
          }
        }
  }

  // One GEMM per (batch, kv head): B·Hkv matrices with the given batch strides.
  static void batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                      int64_t lda, int64_t sa, const float* b, int64_t ldb, int64_t sb, float beta,
                      float* c, int64_t ldc, int64_t sc, const Dims& d) {
    GemmArgs g;
    g.trans_a = ta;
    g.trans_b = tb;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = alpha;
    g.beta = beta;
    g.a = a;
    g.lda = lda;
    g.stride_a = sa;
    g.b = b;
    g.ldb = ldb;
    g.stride_b = sb;
    g.c = c;
    g.ldc = ldc;
    g.stride_c = sc;
    g.batch = d.B * d.Hkv;
    dnnl_gemm(g);
  }

  static void causal_softmax(Tensor probs, const Dims& d) {
    const int64_t rows = d.B * d.H * d.S;
    float* p = probs.f32();
#pragma omp parallel for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t i = row % d.S;
      float* pr = p + row * d.S;
      float mx = pr[0];
      for (int64_t j = 1; j <= i; ++j) mx = std::max(mx, pr[j]);
      float sum = 0.0f;
      for (int64_t j = 0; j <= i; ++j) {
        pr[j] = std::exp(pr[j] - mx);
        sum += pr[j];
      }
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j <= i; ++j) pr[j] *= inv;
      for (int64_t j = i + 1; j < d.S; ++j) pr[j] = 0.0f;
    }
  }

  const RopeTable& rope_table(int64_t S, int64_t hd, float theta) {
    std::lock_guard lock(rope_mutex_);
    auto key = std::make_tuple(S, hd, theta);
    auto it = rope_tables_.find(key);
    if (it != rope_tables_.end()) return it->second;
    RopeTable t;
    const int64_t half = hd / 2;
    t.cos.resize(S * half);
    t.sin.resize(S * half);
    for (int64_t s = 0; s < S; ++s)
      for (int64_t i = 0; i < half; ++i) {
        // Same expression as HF: inv_freq in fp32, then the product in fp32.
        const float inv_freq = 1.0f / std::pow(theta, float(2 * i) / float(hd));
        const float angle = float(s) * inv_freq;
        t.cos[s * half + i] = std::cos(angle);
        t.sin[s * half + i] = std::sin(angle);
      }
    return rope_tables_.emplace(key, std::move(t)).first->second;
  }

  void rope(Tensor x, float theta, float direction) {
    require_f32("rope", {x});
    BOTTLE_CHECK(x.shape.rank == 4 && x.shape[3] % 2 == 0, "rope: x must be [B,S,heads,hd] with even hd");
    const int64_t B = x.shape[0], S = x.shape[1], heads = x.shape[2], hd = x.shape[3], half = hd / 2;
    const RopeTable& t = rope_table(S, hd, theta);
#pragma omp parallel for schedule(static)
    for (int64_t bs = 0; bs < B * S; ++bs) {
      const int64_t s = bs % S;
      const float* cs = t.cos.data() + s * half;
      const float* sn = t.sin.data() + s * half;
      for (int64_t h = 0; h < heads; ++h) {
        float* v = x.f32() + (bs * heads + h) * hd;
#pragma omp simd
        for (int64_t i = 0; i < half; ++i) {
          const float x1 = v[i], x2 = v[i + half], sin = direction * sn[i];
          v[i] = x1 * cs[i] - x2 * sin;
          v[i + half] = x2 * cs[i] + x1 * sin;
        }
      }
    }
  }

  Workspace ws_q_, ws_k_, ws_v_, ws_o_, ws_dq_, ws_dk_, ws_dv_, ws_scores_, dweight_ws_;
  std::mutex rope_mutex_;
  std::map<std::tuple<int64_t, int64_t, float>, RopeTable> rope_tables_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace bottle
