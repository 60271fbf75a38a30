#pragma once
// The per-element math of bottle's kernels, written once and compiled twice: by g++ into the
// CPU backends and by nvcc into the CUDA kernels (src/backend/cuda). The CPU tests therefore
// exercise the formulas the GPU runs; what differs between the two is only how elements are
// scheduled and summed. Each function takes what the kernel already has (an exp or a sigmoid
// computed the backend's own fast way, a row statistic), so a backend keeps its vectorised
// transcendental functions and the formula around them stays shared.
//
// Free of fmt and of anything nvcc cannot compile for the device.
#include <cmath>
#include <cstdint>
#include <cstring>

// Compiler detection, not a backend switch: one header for the host and the device compiler.
#if defined(__CUDACC__)
#define BOTTLE_HD __host__ __device__ __forceinline__
#else
#define BOTTLE_HD inline
#endif

namespace bottle::kmath {

// --- bf16 storage: the top 16 bits of an IEEE float32, rounded to nearest, ties to even.
BOTTLE_HD uint32_t float_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}
BOTTLE_HD float float_of_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}
BOTTLE_HD uint16_t bf16_from_float(float f) {
  const uint32_t u = float_bits(f);
  // A NaN stays a (quiet) NaN: rounding could carry its payload into the exponent.
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the kept part's lowest bit rounds half-way cases to the even one; an
  // overflow rounds to infinity, as IEEE rounding does.
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
BOTTLE_HD float bf16_to_float(uint16_t h) { return float_of_bits(uint32_t(h) << 16); }

// --- Activations. `s` is sigmoid(x), computed by the caller.
BOTTLE_HD float silu(float x, float s) { return x * s; }
// d silu(x) / dx = s + x s (1 - s).
BOTTLE_HD float silu_grad(float x, float s) { return s * (1.0f + x * (1.0f - s)); }
// SiLU backward of one element: dout · silu'(x), rounded as (dout s) (1 + x (1 - s)) (not
// dout · silu_grad, whose last bit can differ): the kernels' backward uses this one.
BOTTLE_HD float silu_dx(float dout, float x, float s) { return dout * s * (1.0f + x * (1.0f - s)); }
// SwiGLU out = act(g) * u; its two gradients, given dout and s = sigmoid(g).
BOTTLE_HD float swiglu(float g, float u, float s, bool gate_act) {
  return gate_act ? g * s * u : g * u;
}
BOTTLE_HD float swiglu_dup(float dout, float g, float s, bool gate_act) {
  return gate_act ? dout * g * s : dout * g;
}
BOTTLE_HD float swiglu_dgate(float dout, float g, float u, float s, bool gate_act) {
  return gate_act ? silu_dx(dout * u, g, s) : dout * u;
}

// --- Norms.
// 1 / sqrt(Σx² / count + eps): RMSNorm's rstd from a row's sum of squares (LayerNorm's from
// the row's sum of squared deviations from its mean).
BOTTLE_HD float rstd_from_sum_squares(float sumsq, float count, float eps) {
  return 1.0f / sqrtf(sumsq / count + eps);
}
BOTTLE_HD float rms_from_sum_squares(float sumsq, float count, float eps, bool reciprocal) {
  const float rms = sqrtf(sumsq / count + eps);
  return reciprocal ? 1.0f / rms : rms;
}
// RMSNorm backward of one element, given the row's rstd and dot = Σ_j weight_j dout_j x_j
// over the whole row of d columns: dx = rstd (w dout - x rstd² dot / d). The part that is
// the same for the whole row, rstd³ dot / d, is rmsnorm_dx_row_factor; a loop over a row
// computes it once and calls rmsnorm_dx_from_factor per element, with the same result.
BOTTLE_HD float rmsnorm_dx_row_factor(float rstd, float dot, float d) {
  return dot * rstd * rstd * rstd / d;
}
BOTTLE_HD float rmsnorm_dx_from_factor(float dout, float x, float w, float rstd, float row_factor) {
  return dout * w * rstd - x * row_factor;
}
BOTTLE_HD float rmsnorm_dx(float dout, float x, float w, float rstd, float dot, float d) {
  return rmsnorm_dx_from_factor(dout, x, w, rstd, rmsnorm_dx_row_factor(rstd, dot, d));
}
// LayerNorm backward of one element: xhat = (x - mean) rstd; mean_g = mean_j(g w),
// mean_gx = mean_j(g w xhat): dx = rstd (g w - mean_g - xhat mean_gx).
BOTTLE_HD float layernorm_dx(float gw, float xhat, float rstd, float mean_g, float mean_gx) {
  return rstd * (gw - mean_g - xhat * mean_gx);
}

// --- Rotary embedding (HF rotate-half): the frequency of pair i of a head of hd dims, in
// fp32 as HF computes it, and the rotation of the pair (x1, x2) = (x[i], x[i + hd/2]) by the
// angle whose cos/sin are given (sin negated for the backward rotation).
BOTTLE_HD float rope_inv_freq(int64_t i, int64_t hd, float theta) {
  return 1.0f / powf(theta, float(2 * i) / float(hd));
}
BOTTLE_HD void rope_rotate(float& x1, float& x2, float cos, float sin) {
  const float a = x1, b = x2;
  x1 = a * cos - b * sin;
  x2 = b * cos + a * sin;
}

// --- Softmax and cross-entropy. An online softmax keeps (max, Σ exp(x - max)) and folds in
// one more value or one more partial pair; `exp_` is the backend's exp.
struct SoftmaxState {
  float max = -INFINITY;
  float sumexp = 0.0f;
};
template <typename Exp>
BOTTLE_HD void softmax_merge(SoftmaxState& s, float other_max, float other_sumexp, Exp exp_) {
  if (other_max == -INFINITY) return;
  if (other_max > s.max) {
    s.sumexp = s.sumexp * exp_(s.max - other_max) + other_sumexp;
    s.max = other_max;
  } else {
    s.sumexp += other_sumexp * exp_(other_max - s.max);
  }
}
// d loss / d logit_j for one row: scale · (p_j - [j == target]).
BOTTLE_HD float cross_entropy_dlogit(float prob, bool is_target, float scale) {
  return scale * (prob - (is_target ? 1.0f : 0.0f));
}
// A rank's share of the whole-row Σexp, rescaled from its local max to the global max.
template <typename Exp>
BOTTLE_HD float rescaled_sumexp(float local_sumexp, float local_max, float max, Exp exp_) {
  return local_sumexp * exp_(local_max - max);
}
BOTTLE_HD float cross_entropy_loss(float sumexp, float max, float target_logit) {
  return logf(sumexp) + max - target_logit;
}

// --- AdamW with decoupled weight decay.
struct AdamWScalars {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  float c1, c2;  // the bias corrections 1 / (1 - beta^step)
};
BOTTLE_HD float adamw_bias_correction(float beta, int64_t step) {
  return 1.0f / (1.0f - powf(beta, float(step)));
}
// Updates one parameter and its two moments in place.
BOTTLE_HD void adamw_step(float& p, float g, float& m, float& v, const AdamWScalars& a) {
  const float gi = g * a.grad_scale;
  m = a.beta1 * m + (1.0f - a.beta1) * gi;
  v = a.beta2 * v + (1.0f - a.beta2) * gi * gi;
  const float update = (m * a.c1) / (sqrtf(v * a.c2) + a.eps);
  p -= a.lr * (update + a.weight_decay * p);
}

// --- Muon (train/muon.h): the element-wise steps around Newton–Schulz.
struct MuonScalars {
  float momentum, grad_scale;
  bool nesterov;
};
// One element of the momentum buffer and of the update it gives.
BOTTLE_HD void muon_momentum_step(float& update, float& buffer, float g, const MuonScalars& s) {
  const float gi = g * s.grad_scale;
  buffer = s.momentum * buffer + gi;
  update = s.nesterov ? gi + s.momentum * buffer : buffer;
}
// 1 / max(‖U‖_F, 1e-7) from ‖U‖_F²: the floor keeps a zero update zero.
BOTTLE_HD float muon_inverse_norm(float sumsq) { return 1.0f / fmaxf(sqrtf(sumsq), 1e-7f); }
// The decoupled weight decay, then the step along the orthogonalised update, in torch's order
// (p.mul_(1 - lr·wd), then p.add_(x, alpha = -lr·adjust)).
BOTTLE_HD float muon_apply_step(float p, float x, float decay, float step) {
  return p * decay - step * x;
}

}  // namespace bottle::kmath
