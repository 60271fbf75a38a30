#include "parallel/online_rmsnorm.h"

#include "parallel/mappings.h"

namespace bottle {

void OnlineRMSNorm::allocate_activations(Allocator& arena, int64_t rows, int64_t cols) {
  out = arena.alloc_act({rows, cols});
  rms_local = arena.alloc({rows});
  rstd = arena.alloc({rows});
  factor = arena.alloc({rows});
  dot = arena.alloc({rows});
}

void OnlineRMSNorm::forward_local(Backend& be, Tensor x, Tensor sumsq) {
  if (one_rank) return be.rmsnorm_forward(out, rstd, x, weight.value, eps);
  be.rmsnorm_shard_forward(out, sumsq, x, weight.value, eps);
}

void OnlineRMSNorm::set_local_rms(Backend& be, Tensor sumsq) {
  be.rms_from_sum_squares(rms_local, sumsq, float(out.cols()), eps, /*reciprocal=*/false);
}

void OnlineRMSNorm::set_whole_rms(Backend& be, Tensor sumsq_total) {
  be.rms_from_sum_squares(rstd, sumsq_total, float(d), eps, /*reciprocal=*/true);
  be.multiply(factor, rms_local, rstd);
}

void OnlineRMSNorm::scale_partials(Backend& be, std::span<const Tensor> partials, Tensor sumsq) {
  if (one_rank) return;
  set_local_rms(be, sumsq);
  for (const Tensor& h : partials) be.scale_rows(h, h, rms_local);
}

void OnlineRMSNorm::finish(Backend& be, std::span<const Tensor> outputs, Tensor sumsq_total) {
  if (one_rank) return;
  set_whole_rms(be, sumsq_total);
  for (const Tensor& z : outputs) be.scale_rows(z, z, rstd);
  be.scale_rows(out, out, factor);
}

void OnlineRMSNorm::recompute(Backend& be, Tensor x, Tensor sumsq_total) {
  forward_local(be, x, factor);  // factor holds S_i until set_whole_rms
  if (one_rank) return;
  set_local_rms(be, factor);
  set_whole_rms(be, sumsq_total);
  be.scale_rows(out, out, factor);
}

void OnlineRMSNorm::latent_statistic(Backend& be,
                                     std::span<const std::pair<Tensor, Tensor>> latents) {
  if (one_rank) return;  // backward takes c from the whole row itself
  be.fill_zero(dot);
  for (const auto& [z, dz] : latents) {
    be.row_dot(factor, dz, z);
    be.accumulate(dot, factor);
  }
  be.divide(dot, dot, rstd);
}

TpTask OnlineRMSNorm::backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dn,
                               Tensor x, std::string_view site) {
  if (one_rank) {
    be.rmsnorm_backward(dx, weight.grad, dn, x, weight.value, rstd);
    co_return;
  }
  if (tp.norm_backward == NormStatistic::all_reduce) {
    // out = x ⊙ γ · rstd, so Σ_local γ dn x = <dn, out> / rstd.
    be.row_dot(dot, dn, out);
    be.divide(dot, dot, rstd);
    // rstd is whole on every rank and scales each rank's columns (copy_to's forward, the
    // identity, in finish): its gradient sums the ranks' shares.
    co_await co_copy_to_backward(tp, dot, site);
  }
  be.rmsnorm_shard_backward(dx, weight.grad, dn, x, weight.value, rstd, dot, d);
}

}  // namespace bottle
