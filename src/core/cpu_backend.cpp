// CPU backend: GEMMs on oneDNN (dnnl_gemm.cpp), everything else as OpenMP loops over rows.
// oneDNN's Debian build uses OpenMP too, so there is one thread pool.
#include "core/cpu_backend.h"

#include <dnnl.h>
#include <omp.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/arena.h"
#include "core/bf16.h"
#include "core/dnnl_gemm.h"
#include "core/host_backend.h"
#include "core/kernel_math.h"

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

// exp that the compiler vectorizes (glibc's expf is scalar unless -ffast-math): 2^t with
// t = x·log2(e) split into an integer n (the exponent bits) and f in [-1/2, 1/2], 2^f by
// its degree-7 Taylor polynomial. Relative error below 2e-7 over the clamped range.
// ±inf give the clamp's values (e^88, e^-87); NaN gives NaN, never an integer conversion of
// NaN, which is undefined (a diverging run feeds NaN here).
inline float fast_exp(float x) {
  // Written so that NaN fails both comparisons and lands on a finite value for the integer
  // part; the final select puts the NaN back. Both compile to vector blends.
  const float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;
  const float t = xc * 1.44269504088896341f;
  // Rounds to nearest by truncating a positive value: std::floor does not vectorize under
  // GCC's default -ftrapping-math. t >= -125.6 after the clamp.
  const float n = float(int32_t(t + 128.5f) - 128);
  const float f = (t - n) * 0.693147180559945f;  // 2^(t-n) = e^f, |f| <= ln2/2
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x == x ? p * scale : x;
}

// Row-major single-threaded-when-nested GEMM: C = alpha op(A) op(B) + beta C.
inline void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// out[0, n) = softmax(x[0, n)) (out may alias x); returns the row's max and Σ exp(x - max).
inline kmath::SoftmaxState softmax_in_place(float* out, const float* x, int64_t n) {
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, x[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    out[j] = fast_exp(x[j] - mx);
    sum += out[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] *= inv;
  return {mx, sum};
}

// log Σ exp(x) of a row from its softmax statistics.
inline float log_sum_exp(const kmath::SoftmaxState& s) { return s.max + std::log(s.sumexp); }

// Runs body(j, j == target) for j in [0, n): the target's element between two loops that
// compare nothing, so that both vectorise (a comparison with the target inside the loop keeps
// GCC from vectorising it), and each element is done in order, while its row is in cache.
// A target outside [0, n) leaves every element a non-target one.
template <typename Body>
inline void for_row_with_target(int64_t n, int64_t target, Body body) {
  const int64_t split = target >= 0 && target < n ? target : n;
#pragma omp simd
  for (int64_t j = 0; j < split; ++j) body(j, false);
  if (split < n) body(split, true);
#pragma omp simd
  for (int64_t j = split + 1; j < n; ++j) body(j, false);
}

// Runs body(i) for i in [0, n), split into one contiguous range per thread; the body is
// inlined into a plain loop that the compiler vectorizes ("omp parallel for simd" over
// captured pointers does not vectorize in GCC 12).
template <typename Body>
void parallel_elementwise(int64_t n, Body body) {
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
#pragma omp simd
    for (int64_t i = begin; i < end; ++i) body(i);
  }
}

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

// oneDNN's bf16 matmul on this CPU ("" where it has none), asked once.
const std::string& bf16_matmul() {
  static const std::string impl = dnnl_bf16_matmul();
  return impl;
}

class CpuBackend final : public HostBackend {
 public:
  std::string_view name() const override { return "cpu"; }

  // bf16 operands only where oneDNN runs them on this CPU's bf16 instructions; elsewhere
  // the widening backend (widening_backend.h) hands this backend fp32.
  std::string bf16_gemm_path() const override {
    return bf16_matmul().empty() ? "none" : fmt::format("oneDNN bf16 matmul ({})", bf16_matmul());
  }

  void do_gemm(const GemmArgs& args) override {
    BOTTLE_CHECK(!args.any_bf16() || (!bf16_matmul().empty() && args.a_dtype == DType::bf16 &&
                                      args.b_dtype == DType::bf16),
                 "cpu backend: gemm of {} x {} -> {} (bf16 GEMMs: {})", dtype_name(args.a_dtype),
                 dtype_name(args.b_dtype), dtype_name(args.c_dtype), bf16_gemm_path());
    dnnl_gemm(args);
  }

  void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) override {
    require_f32("embedding_forward", {out, table});
    require_i32("embedding_forward", tokens);
    const int64_t n = tokens.numel(), c = table.cols(), v = table.rows();
    const int32_t* tok = tokens.i32();
    for (int64_t i = 0; i < n; ++i)
      BOTTLE_CHECK(tok[i] >= 0 && tok[i] < v,
                   "token id {} at position {} is outside the vocabulary [0, {})", tok[i], i, v);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i)
      std::memcpy(out.f32() + i * c, table.f32() + int64_t(tok[i]) * c, c * sizeof(float));
  }

  void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override {
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

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override {
    require_f32("rmsnorm_forward", {out, rstd, x, weight});
    rmsnorm_rows(out, rstd.f32(), nullptr, x, weight, eps);
  }

  // One pass over each row: the sum is written as it is formed, and its squares summed.
  void do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x, Tensor residual,
                                   Tensor weight, float eps) override {
    require_f32("residual_rmsnorm_forward", {sum, out, rstd, x, residual, weight});
    const int64_t n = x.rows(), c = x.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float *xi = x.f32() + i * c, *ri = residual.f32() + i * c;
      float* si = sum.f32() + i * c;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < c; ++j) {
        si[j] = xi[j] + ri[j];
        ss += si[j] * si[j];
      }
      const float r = kmath::rstd_from_sum_squares(ss, float(c), eps);
      rstd.f32()[i] = r;
      float* oi = out.f32() + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) oi[j] = si[j] * r * weight.f32()[j];
    }
  }

  void do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                float eps) override {
    require_f32("rmsnorm_shard_forward", {out, sumsq, x, weight});
    rmsnorm_rows(out, nullptr, sumsq.f32(), x, weight, eps);
  }

  void do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                           Tensor rstd) override {
    require_f32("rmsnorm_backward", {dx, dweight, dout, x, weight, rstd});
    rmsnorm_backward_rows(dx, dweight, dout, x, weight, rstd, nullptr, x.cols());
  }

  void do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                                 Tensor rstd, Tensor dot, int64_t d) override {
    require_f32("rmsnorm_shard_backward", {dx, dweight, dout, x, weight, rstd, dot});
    rmsnorm_backward_rows(dx, dweight, dout, x, weight, rstd, dot.f32(), d);
  }

  void do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                            Tensor bias, float eps) override {
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
      const float r = kmath::rstd_from_sum_squares(v, float(c), eps);
      mean.f32()[i] = mu;
      rstd.f32()[i] = r;
      float* oi = out.f32() + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) oi[j] = (xi[j] - mu) * r * weight.f32()[j] + bias.f32()[j];
    }
  }

  void do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
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
          dxi[j] += kmath::layernorm_dx(gi[j] * weight.f32()[j], xhat, r, sum_g, sum_gx);
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

  void do_rope_forward(Tensor x, float theta) override { rope(x, theta, 1.0f); }
  void do_rope_backward(Tensor dx, float theta) override { rope(dx, theta, -1.0f); }

  // Flash-attention style: each (batch, head) walks its queries in blocks of kQueryBlock
  // rows; a block's scores (at most kQueryBlock x S) stay in a per-thread buffer, so no
  // [S, S] matrix ever reaches memory. Causality bounds each block's keys. Backward
  // recomputes the probabilities from the saved log-sum-exp. Work items run in parallel,
  // each GEMM single-threaded inside them (oneDNN runs serially inside a parallel region).
  void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override {
    require_f32("attention_forward", {out, lse, q, k, v});
    const Dims d = dims(q, k);
    const int64_t nt = omp_get_max_threads();
    float* scratch = attn_ws_.get(size_t(nt) * kQueryBlock * d.S);
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t item = 0; item < d.B * d.H; ++item) {
      const int64_t b = item / d.H, h = item % d.H, g = h / d.rep;
      float* sc = scratch + size_t(omp_get_thread_num()) * kQueryBlock * d.S;
      const float* Q = q.f32() + (b * d.S * d.H + h) * d.hd;
      const float* K = k.f32() + (b * d.S * d.Hkv + g) * d.hd;
      const float* V = v.f32() + (b * d.S * d.Hkv + g) * d.hd;
      float* O = out.f32() + (b * d.S * d.H + h) * d.hd;
      float* L = lse.f32() + (b * d.H + h) * d.S;
      const int64_t ldq = d.H * d.hd, ldk = d.Hkv * d.hd;
      for (int64_t r0 = 0; r0 < d.S; r0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, d.S - r0), keys = r0 + rows;
        sgemm('N', 'T', rows, keys, d.hd, d.scale, Q + r0 * ldq, ldq, K, ldk, 0.0f, sc, keys);
        for (int64_t t = 0; t < rows; ++t) {
          float* row = sc + t * keys;
          const int64_t valid = r0 + t + 1;
          L[r0 + t] = log_sum_exp(softmax_in_place(row, row, valid));
          for (int64_t j = valid; j < keys; ++j) row[j] = 0.0f;
        }
        sgemm('N', 'N', rows, d.hd, keys, 1.0f, sc, keys, V, ldk, 0.0f, O + r0 * ldq, ldq);
      }
    }
  }

  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                             Tensor q, Tensor k, Tensor v) override {
    require_f32("attention_backward", {dq, dk, dv, dout, out, lse, q, k, v});
    const Dims d = dims(q, k);
    const int64_t nt = omp_get_max_threads();
    float* scratch = attn_ws_.get(size_t(nt) * 2 * kQueryBlock * d.S);
    // One item per (batch, kv head): its dK and dV rows are written by it alone.
#pragma omp parallel for schedule(dynamic, 1)
    for (int64_t item = 0; item < d.B * d.Hkv; ++item) {
      const int64_t b = item / d.Hkv, g = item % d.Hkv;
      float* p = scratch + size_t(omp_get_thread_num()) * 2 * kQueryBlock * d.S;
      float* ds = p + kQueryBlock * d.S;
      const int64_t ldq = d.H * d.hd, ldk = d.Hkv * d.hd;
      const float* K = k.f32() + (b * d.S * d.Hkv + g) * d.hd;
      const float* V = v.f32() + (b * d.S * d.Hkv + g) * d.hd;
      float* dK = dk.f32() + (b * d.S * d.Hkv + g) * d.hd;
      float* dV = dv.f32() + (b * d.S * d.Hkv + g) * d.hd;
      for (int64_t h = g * d.rep; h < (g + 1) * d.rep; ++h) {
        const int64_t head = (b * d.S * d.H + h) * d.hd;
        const float *Q = q.f32() + head, *O = out.f32() + head, *dO = dout.f32() + head;
        float* dQ = dq.f32() + head;
        const float* L = lse.f32() + (b * d.H + h) * d.S;
        for (int64_t r0 = 0; r0 < d.S; r0 += kQueryBlock) {
          const int64_t rows = std::min(kQueryBlock, d.S - r0), keys = r0 + rows;
          // P = exp(Q Kᵀ/√hd − lse), dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(dO ⊙ O))
          sgemm('N', 'T', rows, keys, d.hd, d.scale, Q + r0 * ldq, ldq, K, ldk, 0.0f, p, keys);
          sgemm('N', 'T', rows, keys, d.hd, 1.0f, dO + r0 * ldq, ldq, V, ldk, 0.0f, ds, keys);
          for (int64_t t = 0; t < rows; ++t) {
            float *pr = p + t * keys, *dr = ds + t * keys;
            const float *o = O + (r0 + t) * ldq, *go = dO + (r0 + t) * ldq;
            float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
            for (int64_t e = 0; e < d.hd; ++e) delta += o[e] * go[e];
            const int64_t valid = r0 + t + 1;
            const float l = L[r0 + t];
#pragma omp simd
            for (int64_t j = 0; j < valid; ++j) {
              pr[j] = fast_exp(pr[j] - l);
              dr[j] = pr[j] * (dr[j] - delta);
            }
            for (int64_t j = valid; j < keys; ++j) pr[j] = dr[j] = 0.0f;
          }
          // dV += Pᵀ dO;  dQ += dS K / √hd;  dK += dSᵀ Q / √hd
          sgemm('T', 'N', keys, d.hd, rows, 1.0f, p, keys, dO + r0 * ldq, ldq, 1.0f, dV, ldk);
          sgemm('N', 'N', rows, d.hd, keys, d.scale, ds, keys, K, ldk, 1.0f, dQ + r0 * ldq, ldq);
          sgemm('T', 'N', keys, d.hd, rows, d.scale, ds, keys, Q + r0 * ldq, ldq, 1.0f, dK, ldk);
        }
      }
    }
  }

  void do_silu_forward(Tensor out, Tensor x) override {
    require_f32("silu_forward", {out, x});
    const int64_t n = x.numel();
    const float* xs = x.f32();
    float* os = out.f32();
    parallel_elementwise(n, [=](int64_t i) { os[i] = kmath::silu(xs[i], sigmoid(xs[i])); });
  }

  void do_silu_backward(Tensor dx, Tensor dout, Tensor x) override {
    require_f32("silu_backward", {dx, dout, x});
    const int64_t n = x.numel();
    const float *xs = x.f32(), *gs = dout.f32();
    float* ds = dx.f32();
    parallel_elementwise(n,
                         [=](int64_t i) { ds[i] += kmath::silu_dx(gs[i], xs[i], sigmoid(xs[i])); });
  }

  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override {
    require_f32("swiglu_forward", {out, gate, up});
    const int64_t n = gate.numel();
    const float *g = gate.f32(), *u = up.f32();
    float* o = out.f32();
    // One loop per gate_act, so that the identity gate never computes a sigmoid.
    if (gate_act) {
      parallel_elementwise(
          n, [=](int64_t i) { o[i] = kmath::swiglu(g[i], u[i], sigmoid(g[i]), true); });
    } else {
      parallel_elementwise(n, [=](int64_t i) { o[i] = kmath::swiglu(g[i], u[i], 0.0f, false); });
    }
  }

  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                          bool gate_act) override {
    require_f32("swiglu_backward", {dgate, dup, dout, gate, up});
    const int64_t n = gate.numel();
    const float *g = gate.f32(), *u = up.f32(), *d = dout.f32();
    float *dg = dgate.f32(), *du = dup.f32();
    if (gate_act) {
      parallel_elementwise(n, [=](int64_t i) {
        const float s = sigmoid(g[i]);
        du[i] += kmath::swiglu_dup(d[i], g[i], s, true);
        dg[i] += kmath::swiglu_dgate(d[i], g[i], u[i], s, true);
      });
    } else {
      parallel_elementwise(n, [=](int64_t i) {
        du[i] += kmath::swiglu_dup(d[i], g[i], 0.0f, false);
        dg[i] += kmath::swiglu_dgate(d[i], g[i], u[i], 0.0f, false);
      });
    }
  }

  void do_add(Tensor out, Tensor a, Tensor b) override {
    require_f32("add", {out, a, b});
    const int64_t n = out.numel();
    const float *x = a.f32(), *y = b.f32();
    float* o = out.f32();
    parallel_elementwise(n, [=](int64_t i) { o[i] = x[i] + y[i]; });
  }

  void do_accumulate(Tensor dst, Tensor src) override {
    require_f32("accumulate", {dst, src});
    const int64_t n = dst.numel();
    const float* s = src.f32();
    float* o = dst.f32();
    parallel_elementwise(n, [=](int64_t i) { o[i] += s[i]; });
  }

  void do_fill_zero(Tensor x) override {
    const size_t bytes = x.nbytes();
    char* base = static_cast<char*>(x.data);
#pragma omp parallel
    {
      const size_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const size_t begin = bytes * t / nt / 64 * 64,
                   end = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
      std::memset(base + begin, 0, end - begin);
    }
  }

  void do_scale(Tensor x, float factor) override {
    require_f32("scale", {x});
    const int64_t n = x.numel();
    float* o = x.f32();
    parallel_elementwise(n, [=](int64_t i) { o[i] *= factor; });
  }

  double do_sum_squares(Tensor x) override {
    require_f32("sum_squares", {x});
    // Chunks of a fixed size, each summed in order, and the chunks' sums added in order: the
    // same bits whatever the thread count (a gradient norm decides clipping).
    constexpr int64_t kChunk = 1 << 14;
    const int64_t n = x.numel(), chunks = (n + kChunk - 1) / kChunk;
    const float* s = x.f32();
    std::vector<double> partial(size_t(chunks), 0.0);
#pragma omp parallel for schedule(static)
    for (int64_t c = 0; c < chunks; ++c) {
      double sum = 0.0;
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i)
        sum += double(s[i]) * s[i];
      partial[size_t(c)] = sum;
    }
    double total = 0.0;
    for (const double p : partial) total += p;
    return total;
  }

  void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                Tensor targets) override {
    require_f32("cross_entropy_forward", {losses, probs, logits});
    require_i32("cross_entropy_forward", targets);
    const int64_t n = logits.rows(), v = logits.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* li = logits.f32() + i * v;
      float* pi = probs.f32() + i * v;
      const kmath::SoftmaxState st = softmax_in_place(pi, li, v);
      losses.f32()[i] = kmath::cross_entropy_loss(st.sumexp, st.max, li[targets.i32()[i]]);
    }
  }

  void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                 float scale) override {
    require_f32("cross_entropy_backward", {dlogits, probs});
    require_i32("cross_entropy_backward", targets);
    const int64_t n = probs.rows(), v = probs.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* pi = probs.f32() + i * v;
      float* di = dlogits.f32() + i * v;
      for_row_with_target(v, targets.i32()[i], [=](int64_t j, bool is_target) {
        di[j] += kmath::cross_entropy_dlogit(pi[j], is_target, scale);
      });
    }
  }

  void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override {
    require_f32("embedding_shard_forward", {out, table});
    require_i32("embedding_shard_forward", tokens);
    const int64_t n = tokens.numel(), c = table.cols(), rows = table.rows();
    const int32_t* tok = tokens.i32();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const int64_t row = int64_t(tok[i]) - first;
      if (row >= 0 && row < rows)
        std::memcpy(out.f32() + i * c, table.f32() + row * c, c * sizeof(float));
      else
        std::memset(out.f32() + i * c, 0, c * sizeof(float));
    }
  }

  void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                   int64_t first) override {
    require_f32("embedding_shard_backward", {dtable, dout});
    require_i32("embedding_shard_backward", tokens);
    const int64_t n = tokens.numel(), c = dtable.cols(), rows = dtable.rows();
    const int32_t* tok = tokens.i32();
#pragma omp parallel
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      const int64_t c0 = c * t / nt, c1 = c * (t + 1) / nt;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t row = int64_t(tok[i]) - first;
        if (row < 0 || row >= rows) continue;
        float* dst = dtable.f32() + row * c;
        const float* src = dout.f32() + i * c;
        for (int64_t j = c0; j < c1; ++j) dst[j] += src[j];
      }
    }
  }

  void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override {
    require_f32("logits_row_stats", {max, sumexp, logits});
    const int64_t n = logits.rows(), v = logits.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* li = logits.f32() + i * v;
      float mx = li[0];
#pragma omp simd reduction(max : mx)
      for (int64_t j = 1; j < v; ++j) mx = std::max(mx, li[j]);
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t j = 0; j < v; ++j) sum += fast_exp(li[j] - mx);
      // The vectorized max may skip a NaN logit (it depends on the lanes); the sum never does.
      max.f32()[i] = std::isnan(sum) ? sum : mx;
      sumexp.f32()[i] = sum;
    }
  }

  void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                       Tensor targets, int64_t first, float scale) override {
    require_f32("cross_entropy_shard_backward", {dlogits, logits, max, sumexp});
    require_i32("cross_entropy_shard_backward", targets);
    const int64_t n = logits.rows(), v = logits.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* li = logits.f32() + i * v;
      float* di = dlogits.f32() + i * v;
      const float mx = max.f32()[i], inv_sumexp = 1.0f / sumexp.f32()[i];
      // The target may lie in another rank's shard, outside [0, v).
      for_row_with_target(v, int64_t(targets.i32()[i]) - first, [=](int64_t j, bool is_target) {
        di[j] += kmath::cross_entropy_dlogit(fast_exp(li[j] - mx) * inv_sumexp, is_target, scale);
      });
    }
  }

  void do_copy(Tensor dst, Tensor src) override {
    if (copy_scalars(dst, src)) return;
    BOTTLE_CHECK(dst.dtype == src.dtype && dst.numel() == src.numel(),
                 "cpu backend: copy of {} {} into {} {}", dtype_name(src.dtype), src.shape.str(),
                 dtype_name(dst.dtype), dst.shape.str());
    const size_t bytes = src.nbytes();
    char* o = static_cast<char*>(dst.data);
    const char* s = static_cast<const char*>(src.data);
#pragma omp parallel
    {
      const size_t nt = omp_get_num_threads(), t = omp_get_thread_num();
      const size_t begin = bytes * t / nt / 64 * 64,
                   end = t + 1 == nt ? bytes : bytes * (t + 1) / nt / 64 * 64;
      if (end > begin) std::memcpy(o + begin, s + begin, end - begin);
    }
  }

  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override {
    check_copy_columns("cpu", dst, dst_col, src, src_col, cols);
    const int64_t n = dst.rows(), size = int64_t(dtype_size(dst.dtype));
    const int64_t dst_row = dst.cols() * size, src_row = src.cols() * size;
    char* o = static_cast<char*>(dst.data) + dst_col * size;
    const char* s = static_cast<const char*>(src.data) + src_col * size;
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) std::memcpy(o + i * dst_row, s + i * src_row, cols * size);
  }

  int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) override {
    require_i32("first_outside", ids);
    const int32_t* id = ids.i32();
    for (int64_t i = 0; i < ids.numel(); ++i)
      if (id[i] < lo || id[i] >= hi) return i;
    return -1;
  }

  double do_sum(Tensor x) override {
    require_f32("sum", {x});
    const float* s = x.f32();
    double total = 0.0;
    for (int64_t i = 0; i < x.numel(); ++i) total += s[i];
    return total;
  }

  void do_multiply(Tensor out, Tensor a, Tensor b) override {
    require_f32("multiply", {out, a, b});
    const float *x = a.f32(), *y = b.f32();
    float* o = out.f32();
    parallel_elementwise(out.numel(), [=](int64_t i) { o[i] = x[i] * y[i]; });
  }

  void do_divide(Tensor out, Tensor a, Tensor b) override {
    require_f32("divide", {out, a, b});
    const float *x = a.f32(), *y = b.f32();
    float* o = out.f32();
    parallel_elementwise(out.numel(), [=](int64_t i) { o[i] = x[i] / y[i]; });
  }

  void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                               bool reciprocal) override {
    require_f32("rms_from_sum_squares", {out, sumsq});
    const float* s = sumsq.f32();
    float* o = out.f32();
    for (int64_t i = 0; i < out.numel(); ++i)
      o[i] = kmath::rms_from_sum_squares(s[i], count, eps, reciprocal);
  }

  void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                       Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                       int64_t first) override {
    require_f32("cross_entropy_shard_partials",
                {sumexp, target_logit, local_sumexp, local_max, max, logits});
    require_i32("cross_entropy_shard_partials", targets);
    const int64_t n = logits.rows(), v = logits.cols();
    for (int64_t i = 0; i < n; ++i) {
      sumexp.f32()[i] = kmath::rescaled_sumexp(local_sumexp.f32()[i], local_max.f32()[i],
                                               max.f32()[i], [](float x) { return std::exp(x); });
      const int64_t t = int64_t(targets.i32()[i]) - first;
      target_logit.f32()[i] = t >= 0 && t < v ? logits.f32()[i * v + t] : 0.0f;
    }
  }

  void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                     Tensor max) override {
    require_f32("cross_entropy_shard_losses", {losses, sumexp, target_logit, max});
    for (int64_t i = 0; i < losses.numel(); ++i)
      losses.f32()[i] =
          kmath::cross_entropy_loss(sumexp.f32()[i], max.f32()[i], target_logit.f32()[i]);
  }

  void do_scale_rows(Tensor out, Tensor x, Tensor factor) override {
    require_f32("scale_rows", {out, x, factor});
    const int64_t n = x.rows(), c = x.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float f = factor.f32()[i];
      const float* xi = x.f32() + i * c;
      float* oi = out.f32() + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * f;
    }
  }

  void do_row_dot(Tensor out, Tensor a, Tensor b) override {
    require_f32("row_dot", {out, a, b});
    const int64_t n = a.rows(), c = a.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* ai = a.f32() + i * c;
      const float* bi = b.f32() + i * c;
      float s = 0.0f;
#pragma omp simd reduction(+ : s)
      for (int64_t j = 0; j < c; ++j) s += ai[j] * bi[j];
      out.f32()[i] = s;
    }
  }

  void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                       Tensor control, const AdamWArgs& a) override {
    if (!control.empty() && control.f32()[kControlApply] == 0.0f) return;
    const float scale = control.empty() ? a.grad_scale : control.f32()[kControlScale];
    float *p = param.f32(), *g = grad.f32(), *ms = m.f32(), *vs = v.f32();
    const kmath::AdamWScalars decay{a.lr,
                                    a.beta1,
                                    a.beta2,
                                    a.eps,
                                    a.weight_decay,
                                    scale,
                                    kmath::adamw_bias_correction(a.beta1, a.step),
                                    kmath::adamw_bias_correction(a.beta2, a.step)};
    kmath::AdamWScalars no_decay = decay;
    no_decay.weight_decay = 0.0f;
    // The buffer alternates between decaying stretches and the no-decay ranges; each stretch
    // is one parallel pass that also writes the compute copy.
    auto run = [&](int64_t lo, int64_t hi, const kmath::AdamWScalars& s) {
      if (hi <= lo) return;
      if (compute.empty()) {
        parallel_elementwise(hi - lo, [=](int64_t j) {
          const int64_t i = lo + j;
          kmath::adamw_step(p[i], g[i], ms[i], vs[i], s);
        });
      } else if (compute.dtype == DType::bf16) {
        uint16_t* c = compute.bf16();
        parallel_elementwise(hi - lo, [=](int64_t j) {
          const int64_t i = lo + j;
          kmath::adamw_step(p[i], g[i], ms[i], vs[i], s);
          c[i] = bf16_from_float(p[i]);
        });
      } else {
        float* c = compute.f32();
        parallel_elementwise(hi - lo, [=](int64_t j) {
          const int64_t i = lo + j;
          kmath::adamw_step(p[i], g[i], ms[i], vs[i], s);
          c[i] = p[i];
        });
      }
    };
    int64_t at = 0;
    for (const ElementRange& r : a.no_decay) {
      run(at, r.offset, decay);
      run(r.offset, r.offset + r.count, no_decay);
      at = r.offset + r.count;
    }
    run(at, param.numel(), decay);
  }

 private:
  // out = x * weight / sqrt(Σx²/C + eps) per row; keeps rstd and/or Σx² where given.
  static void rmsnorm_rows(Tensor out, float* rstd, float* sumsq, Tensor x, Tensor weight,
                           float eps) {
    const int64_t n = x.rows(), c = x.cols();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const float* xi = x.f32() + i * c;
      float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
      for (int64_t j = 0; j < c; ++j) ss += xi[j] * xi[j];
      const float r = kmath::rstd_from_sum_squares(ss, float(c), eps);
      if (rstd) rstd[i] = r;
      if (sumsq) sumsq[i] = ss;
      float* oi = out.f32() + i * c;
#pragma omp simd
      for (int64_t j = 0; j < c; ++j) oi[j] = xi[j] * r * weight.f32()[j];
    }
  }

  // RMSNorm backward over C of a row's d columns; dot[i] = Σ over the d columns of g w x,
  // given, or (null, C = d) computed from the row.
  void rmsnorm_backward_rows(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                             Tensor rstd, const float* dot, int64_t d) {
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
        float row_dot = 0.0f;
        if (dot) {
          row_dot = dot[i];
        } else {
#pragma omp simd reduction(+ : row_dot)
          for (int64_t j = 0; j < c; ++j) row_dot += gi[j] * weight.f32()[j] * xi[j];
        }
        const float k = kmath::rmsnorm_dx_row_factor(r, row_dot, float(d));
#pragma omp simd
        for (int64_t j = 0; j < c; ++j) {
          dxi[j] += kmath::rmsnorm_dx_from_factor(gi[j], xi[j], weight.f32()[j], r, k);
          dw[j] += gi[j] * xi[j] * r;
        }
      }
    }
    for (int t = 0; t < nt; ++t)
      for (int64_t j = 0; j < c; ++j) dweight.f32()[j] += partial[size_t(t) * c + j];
  }

  static constexpr int64_t kQueryBlock = 128;

  struct Dims {
    int64_t B, S, H, Hkv, hd, rep;
    float scale;
  };

  static Dims dims(const Tensor& q, const Tensor& k) {
    BOTTLE_CHECK(q.shape.rank == 4 && k.shape.rank == 4,
                 "attention: q and k must be [B,S,heads,hd]");
    Dims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], 0, 0.0f};
    BOTTLE_CHECK(d.Hkv > 0 && d.H % d.Hkv == 0,
                 "attention: {} query heads not divisible by {} kv heads", d.H, d.Hkv);
    d.rep = d.H / d.Hkv;
    d.scale = 1.0f / std::sqrt(float(d.hd));
    return d;
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
        const float inv_freq = kmath::rope_inv_freq(i, hd, theta);
        const float angle = float(s) * inv_freq;
        t.cos[s * half + i] = std::cos(angle);
        t.sin[s * half + i] = std::sin(angle);
      }
    return rope_tables_.emplace(key, std::move(t)).first->second;
  }

  void rope(Tensor x, float theta, float direction) {
    require_f32("rope", {x});
    BOTTLE_CHECK(x.shape.rank == 4 && x.shape[3] % 2 == 0,
                 "rope: x must be [B,S,heads,hd] with even hd");
    const int64_t B = x.shape[0], S = x.shape[1], heads = x.shape[2], hd = x.shape[3],
                  half = hd / 2;
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
          float x1 = v[i], x2 = v[i + half];
          kmath::rope_rotate(x1, x2, cs[i], direction * sn[i]);
          v[i] = x1;
          v[i + half] = x2;
        }
      }
    }
  }

  Workspace attn_ws_, dweight_ws_;
  std::mutex rope_mutex_;
  std::map<std::tuple<int64_t, int64_t, float>, RopeTable> rope_tables_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend() { return std::make_unique<CpuBackend>(); }

}  // namespace bottle
