#include "core/profiling_backend.h"

#include <chrono>

namespace bottle {

template <typename F>
auto ProfilingBackend::timed(const std::string& kernel, F&& f, double flops) {
  // The marks bracket the kernel in the inner backend's stream; the kernel may return before
  // it has run, and times() reads them later.
  struct Record {
    ProfilingBackend& self;
    KernelTime& t;
    int64_t from;
    double flops;
    ~Record() { self.pending_.push_back({&t, from, self.inner_->timing_mark(), flops}); }
  } record{*this, times_[kernel], inner_->timing_mark(), flops};
  return f();
}

const std::map<std::string, KernelTime>& ProfilingBackend::times() {
  for (const Pending& p : pending_) {
    p.time->ms += inner_->marks_elapsed_ms(p.from, p.to);
    p.time->flops += p.flops;
    ++p.time->calls;
  }
  pending_.clear();
  inner_->reset_marks();
  return times_;
}

void ProfilingBackend::reset() {
  pending_.clear();
  inner_->reset_marks();
  times_.clear();
}

void ProfilingBackend::sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) {
  timed("sum_squares_ranges", [&] { inner_->sum_squares_ranges(out, x, ranges); });
}
void ProfilingBackend::accumulate_mean(Tensor acc, Tensor x) {
  timed("accumulate_mean", [&] { inner_->accumulate_mean(acc, x); });
}
void ProfilingBackend::scalar_add(Tensor out, Tensor a, Tensor b) {
  timed("scalar", [&] { inner_->scalar_add(out, a, b); });
}
void ProfilingBackend::scalar_divide(Tensor out, Tensor a, double divisor) {
  timed("scalar", [&] { inner_->scalar_divide(out, a, divisor); });
}
void ProfilingBackend::scalar_sqrt(Tensor out, Tensor a) {
  timed("scalar", [&] { inner_->scalar_sqrt(out, a); });
}
void ProfilingBackend::clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) {
  timed("clip_and_check", [&] { inner_->clip_and_check(control, loss, norm, max_norm); });
}

void ProfilingBackend::to_host(void* dst, Tensor src) {
  timed("to_host", [&] { inner_->to_host(dst, src); });
}
void ProfilingBackend::from_host(Tensor dst, const void* src) {
  timed("from_host", [&] { inner_->from_host(dst, src); });
}
void ProfilingBackend::copy(Tensor dst, Tensor src) {
  timed("copy", [&] { inner_->copy(dst, src); });
}
void ProfilingBackend::copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                                    int64_t cols) {
  timed("copy_columns", [&] { inner_->copy_columns(dst, dst_col, src, src_col, cols); });
}
int64_t ProfilingBackend::first_outside(Tensor ids, int64_t lo, int64_t hi) {
  return timed("first_outside", [&] { return inner_->first_outside(ids, lo, hi); });
}
double ProfilingBackend::sum(Tensor x) {
  return timed("sum", [&] { return inner_->sum(x); });
}
void ProfilingBackend::multiply(Tensor out, Tensor a, Tensor b) {
  timed("multiply", [&] { inner_->multiply(out, a, b); });
}
void ProfilingBackend::divide(Tensor out, Tensor a, Tensor b) {
  timed("divide", [&] { inner_->divide(out, a, b); });
}
void ProfilingBackend::rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                            bool reciprocal) {
  timed("rms_from_sum_squares",
        [&] { inner_->rms_from_sum_squares(out, sumsq, count, eps, reciprocal); });
}
void ProfilingBackend::cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                                    Tensor local_sumexp, Tensor local_max,
                                                    Tensor max, Tensor logits, Tensor targets,
                                                    int64_t first) {
  timed("cross_entropy_shard_partials", [&] {
    inner_->cross_entropy_shard_partials(sumexp, target_logit, local_sumexp, local_max, max, logits,
                                         targets, first);
  });
}
void ProfilingBackend::cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                                  Tensor max) {
  timed("cross_entropy_shard_losses",
        [&] { inner_->cross_entropy_shard_losses(losses, sumexp, target_logit, max); });
}

void ProfilingBackend::gemm(const GemmArgs& a) {
  const std::string key = fmt::format(
      "gemm {}x{}x{} {}{}{}{}", a.m, a.n, a.k, a.trans_a ? 'T' : 'N', a.trans_b ? 'T' : 'N',
      a.batch > 1 ? fmt::format(" x{}", a.batch) : "", a.any_bf16() ? " bf16" : "");
  timed(
      key, [&] { inner_->gemm(a); },
      2.0 * double(a.m) * double(a.n) * double(a.k) * double(a.batch));
}
void ProfilingBackend::embedding_forward(Tensor out, Tensor tokens, Tensor table) {
  timed("embedding_forward", [&] { inner_->embedding_forward(out, tokens, table); });
}
void ProfilingBackend::embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  timed("embedding_backward", [&] { inner_->embedding_backward(dtable, tokens, dout); });
}
void ProfilingBackend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight,
                                       float eps) {
  timed("rmsnorm_forward", [&] { inner_->rmsnorm_forward(out, rstd, x, weight, eps); });
}
void ProfilingBackend::rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                        Tensor weight, Tensor rstd) {
  timed("rmsnorm_backward", [&] { inner_->rmsnorm_backward(dx, dweight, dout, x, weight, rstd); });
}
void ProfilingBackend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x,
                                         Tensor weight, Tensor bias, float eps) {
  timed("layernorm_forward",
        [&] { inner_->layernorm_forward(out, mean, rstd, x, weight, bias, eps); });
}
void ProfilingBackend::layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                                          Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  timed("layernorm_backward",
        [&] { inner_->layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd); });
}
void ProfilingBackend::rope_forward(Tensor x, float theta) {
  timed("rope_forward", [&] { inner_->rope_forward(x, theta); });
}
void ProfilingBackend::rope_backward(Tensor dx, float theta) {
  timed("rope_backward", [&] { inner_->rope_backward(dx, theta); });
}
void ProfilingBackend::attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  timed("attention_forward", [&] { inner_->attention_forward(out, lse, q, k, v); });
}
void ProfilingBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                                          Tensor lse, Tensor q, Tensor k, Tensor v) {
  timed("attention_backward",
        [&] { inner_->attention_backward(dq, dk, dv, dout, out, lse, q, k, v); });
}
void ProfilingBackend::silu_forward(Tensor out, Tensor x) {
  timed("silu_forward", [&] { inner_->silu_forward(out, x); });
}
void ProfilingBackend::silu_backward(Tensor dx, Tensor dout, Tensor x) {
  timed("silu_backward", [&] { inner_->silu_backward(dx, dout, x); });
}
void ProfilingBackend::swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) {
  timed("swiglu_forward", [&] { inner_->swiglu_forward(out, gate, up, gate_act); });
}
void ProfilingBackend::swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate,
                                       Tensor up, bool gate_act) {
  timed("swiglu_backward", [&] { inner_->swiglu_backward(dgate, dup, dout, gate, up, gate_act); });
}
void ProfilingBackend::add(Tensor out, Tensor a, Tensor b) {
  timed("add", [&] { inner_->add(out, a, b); });
}
void ProfilingBackend::accumulate(Tensor dst, Tensor src) {
  timed("accumulate", [&] { inner_->accumulate(dst, src); });
}
void ProfilingBackend::fill_zero(Tensor x) {
  timed("fill_zero", [&] { inner_->fill_zero(x); });
}
void ProfilingBackend::scale(Tensor x, float factor) {
  timed("scale", [&] { inner_->scale(x, factor); });
}
double ProfilingBackend::sum_squares(Tensor x) {
  return timed("sum_squares", [&] { return inner_->sum_squares(x); });
}
void ProfilingBackend::cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                             Tensor targets) {
  timed("cross_entropy_forward",
        [&] { inner_->cross_entropy_forward(losses, probs, logits, targets); });
}
void ProfilingBackend::cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                              float scale) {
  timed("cross_entropy_backward",
        [&] { inner_->cross_entropy_backward(dlogits, probs, targets, scale); });
}
void ProfilingBackend::adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                                    Tensor control, const AdamWArgs& args) {
  timed("adamw_update", [&] { inner_->adamw_update(param, compute, grad, m, v, control, args); });
}

void ProfilingBackend::embedding_shard_forward(Tensor out, Tensor tokens, Tensor table,
                                               int64_t first) {
  timed("embedding_shard_forward",
        [&] { inner_->embedding_shard_forward(out, tokens, table, first); });
}
void ProfilingBackend::embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                                int64_t first) {
  timed("embedding_shard_backward",
        [&] { inner_->embedding_shard_backward(dtable, tokens, dout, first); });
}
void ProfilingBackend::logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  timed("logits_row_stats", [&] { inner_->logits_row_stats(max, sumexp, logits); });
}
void ProfilingBackend::cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                                    Tensor sumexp, Tensor targets, int64_t first,
                                                    float scale) {
  timed("cross_entropy_shard_backward", [&] {
    inner_->cross_entropy_shard_backward(dlogits, logits, max, sumexp, targets, first, scale);
  });
}
void ProfilingBackend::rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                             float eps) {
  timed("rmsnorm_shard_forward",
        [&] { inner_->rmsnorm_shard_forward(out, sumsq, x, weight, eps); });
}
void ProfilingBackend::rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                              Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  timed("rmsnorm_shard_backward",
        [&] { inner_->rmsnorm_shard_backward(dx, dweight, dout, x, weight, rstd, dot, d); });
}
void ProfilingBackend::scale_rows(Tensor out, Tensor x, Tensor factor) {
  timed("scale_rows", [&] { inner_->scale_rows(out, x, factor); });
}
void ProfilingBackend::row_dot(Tensor out, Tensor a, Tensor b) {
  timed("row_dot", [&] { inner_->row_dot(out, a, b); });
}

}  // namespace bottle
