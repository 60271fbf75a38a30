#include "parallel/online_rmsnorm.h"

#include <cmath>

#include "parallel/mappings.h"

namespace bottle {

void OnlineRMSNorm::allocate_activations(Allocator& arena, int64_t rows, int64_t cols) {
  out = arena.alloc({rows, cols});
  rms_local = arena.alloc({rows});
  rstd = arena.alloc({rows});
  factor = arena.alloc({rows});
  dot = arena.alloc({rows});
}

void OnlineRMSNorm::forward_local(Backend& be, Tensor x, Tensor sumsq) {
  be.rmsnorm_shard_forward(out, sumsq, x, weight.value, eps);
}

void OnlineRMSNorm::set_local_rms(Tensor sumsq) {
  const int64_t n = out.rows(), cols = out.cols();
  for (int64_t i = 0; i < n; ++i)
    rms_local.f32()[i] = std::sqrt(sumsq.f32()[i] / float(cols) + eps);
}

void OnlineRMSNorm::set_whole_rms(Tensor sumsq_total) {
  const int64_t n = out.rows();
  for (int64_t i = 0; i < n; ++i) {
    rstd.f32()[i] = 1.0f / std::sqrt(sumsq_total.f32()[i] / float(d) + eps);
    factor.f32()[i] = rms_local.f32()[i] * rstd.f32()[i];
  }
}

void OnlineRMSNorm::scale_partials(Backend& be, std::span<const Tensor> partials, Tensor sumsq) {
  set_local_rms(sumsq);
  for (const Tensor& h : partials) be.scale_rows(h, h, rms_local);
}

void OnlineRMSNorm::finish(Backend& be, std::span<const Tensor> outputs, Tensor sumsq_total) {
  set_whole_rms(sumsq_total);
  for (const Tensor& z : outputs) be.scale_rows(z, z, rstd);
  be.scale_rows(out, out, factor);
}

void OnlineRMSNorm::recompute(Backend& be, Tensor x, Tensor sumsq_total) {
  forward_local(be, x, factor);  // factor holds S_i until set_whole_rms
  set_local_rms(factor);
  set_whole_rms(sumsq_total);
  be.scale_rows(out, out, factor);
}

void OnlineRMSNorm::latent_statistic(Backend& be,
                                     std::span<const std::pair<Tensor, Tensor>> latents) {
  const int64_t n = out.rows();
  be.fill_zero(dot);
  for (const auto& [z, dz] : latents) {
    be.row_dot(factor, dz, z);
    for (int64_t i = 0; i < n; ++i) dot.f32()[i] += factor.f32()[i];
  }
  for (int64_t i = 0; i < n; ++i) dot.f32()[i] /= rstd.f32()[i];
}

void OnlineRMSNorm::backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dn, Tensor x,
                             std::string_view site) {
  if (tp.norm_backward == NormStatistic::all_reduce) {
    // out = x ⊙ γ · rstd, so Σ_local γ dn x = <dn, out> / rstd.
    const int64_t n = out.rows();
    be.row_dot(dot, dn, out);
    for (int64_t i = 0; i < n; ++i) dot.f32()[i] /= rstd.f32()[i];
    copy_to_backward(tp, dot, site);
  }
  be.rmsnorm_shard_backward(dx, weight.grad, dn, x, weight.value, rstd, dot, d);
}

}  // namespace bottle
