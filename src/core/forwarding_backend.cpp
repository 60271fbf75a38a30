#include "core/forwarding_backend.h"

#include <algorithm>

namespace bottle {

namespace {

int64_t range_elements(std::span<const SumRange> ranges) {
  int64_t n = 0;
  for (const SumRange& r : ranges) n += r.count;
  return n;
}

}  // namespace

double causal_attention_flops(const Tensor& q) {
  const double B = double(q.shape[0]), S = double(q.shape[1]), H = double(q.shape[2]),
               hd = double(q.shape[3]);
  return 4.0 * B * H * hd * S * (S + 1.0) / 2.0;
}

void ForwardingBackend::do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                                        int64_t cols) {
  // The columns moved, read once and written once.
  const Tensor columns{nullptr, {dst.rows(), cols}, dst.dtype, dst.device};
  around("copy_columns", {columns, columns}, 0.0,
         [&] { inner().copy_columns(dst, dst_col, src, src_col, cols); });
}

void ForwardingBackend::do_gemm(const GemmArgs& args) {
  around("gemm", {}, 0.0, [&] { inner().gemm(args); });
}

void ForwardingBackend::do_to_host(void* dst, Tensor src) {
  around("to_host", {src}, 0.0, [&] { inner().to_host(dst, src); });
}
void ForwardingBackend::do_from_host(Tensor dst, const void* src) {
  around("from_host", {dst}, 0.0, [&] { inner().from_host(dst, src); });
}
void ForwardingBackend::do_copy(Tensor dst, Tensor src) {
  around("copy", {dst, src}, 0.0, [&] { inner().copy(dst, src); });
}
int64_t ForwardingBackend::do_first_outside(Tensor ids, int64_t lo, int64_t hi) {
  int64_t result = -1;
  around("first_outside", {ids}, 0.0, [&] { result = inner().first_outside(ids, lo, hi); });
  return result;
}
void ForwardingBackend::do_embedding_forward(Tensor out, Tensor tokens, Tensor table) {
  around("embedding_forward", {out, out, tokens}, 0.0,
         [&] { inner().embedding_forward(out, tokens, table); });
}
void ForwardingBackend::do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  around("embedding_backward", {dout, dout, dout, tokens}, 0.0,
         [&] { inner().embedding_backward(dtable, tokens, dout); });
}
void ForwardingBackend::do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight,
                                           float eps) {
  around("rmsnorm_forward", {out, rstd, x, weight}, 0.0,
         [&] { inner().rmsnorm_forward(out, rstd, x, weight, eps); });
}
void ForwardingBackend::do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x,
                                                    Tensor residual, Tensor weight, float eps) {
  around("residual_rmsnorm_forward", {sum, out, rstd, x, residual, weight}, 0.0,
         [&] { inner().residual_rmsnorm_forward(sum, out, rstd, x, residual, weight, eps); });
}
void ForwardingBackend::do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                            Tensor weight, Tensor rstd) {
  around("rmsnorm_backward", {dx, dx, dweight, dout, x, weight, rstd}, 0.0,
         [&] { inner().rmsnorm_backward(dx, dweight, dout, x, weight, rstd); });
}
void ForwardingBackend::do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x,
                                             Tensor weight, Tensor bias, float eps) {
  around("layernorm_forward", {out, mean, rstd, x, weight, bias}, 0.0,
         [&] { inner().layernorm_forward(out, mean, rstd, x, weight, bias, eps); });
}
void ForwardingBackend::do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                                              Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  around("layernorm_backward", {dx, dweight, dbias, dout, x, weight, mean, rstd}, 0.0,
         [&] { inner().layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd); });
}
void ForwardingBackend::do_rope_forward(Tensor q, Tensor k, float theta) {
  around("rope_forward", {q, k, q, k}, 0.0, [&] { inner().rope_forward(q, k, theta); });
}
void ForwardingBackend::do_rope_backward(Tensor dq, Tensor dk, float theta) {
  around("rope_backward", {dq, dk, dq, dk}, 0.0, [&] { inner().rope_backward(dq, dk, theta); });
}
void ForwardingBackend::do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  around("attention_forward", {out, lse, q, k, v}, causal_attention_flops(q),
         [&] { inner().attention_forward(out, lse, q, k, v); });
}
void ForwardingBackend::do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout,
                                              Tensor out, Tensor lse, Tensor q, Tensor k,
                                              Tensor v) {
  around("attention_backward", {dq, dk, dv, dout, out, lse, q, k, v},
         2.5 * causal_attention_flops(q),
         [&] { inner().attention_backward(dq, dk, dv, dout, out, lse, q, k, v); });
}
void ForwardingBackend::do_silu_forward(Tensor out, Tensor x) {
  around("silu_forward", {out, x}, 0.0, [&] { inner().silu_forward(out, x); });
}
void ForwardingBackend::do_silu_backward(Tensor dx, Tensor dout, Tensor x) {
  around("silu_backward", {dx, dout, x}, 0.0, [&] { inner().silu_backward(dx, dout, x); });
}
void ForwardingBackend::do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) {
  around("swiglu_forward", {out, gate, up}, 0.0,
         [&] { inner().swiglu_forward(out, gate, up, gate_act); });
}
void ForwardingBackend::do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate,
                                           Tensor up, bool gate_act) {
  around("swiglu_backward", {dgate, dup, dout, gate, up}, 0.0,
         [&] { inner().swiglu_backward(dgate, dup, dout, gate, up, gate_act); });
}
void ForwardingBackend::do_add(Tensor out, Tensor a, Tensor b) {
  around("add", {out, a, b}, 0.0, [&] { inner().add(out, a, b); });
}
void ForwardingBackend::do_accumulate(Tensor dst, Tensor src) {
  around("accumulate", {dst, dst, src}, 0.0, [&] { inner().accumulate(dst, src); });
}
void ForwardingBackend::do_fill_zero(Tensor x) {
  around("fill_zero", {x}, 0.0, [&] { inner().fill_zero(x); });
}
void ForwardingBackend::do_scale(Tensor x, float factor) {
  around("scale", {x, x}, 0.0, [&] { inner().scale(x, factor); });
}
double ForwardingBackend::do_sum_squares(Tensor x) {
  double result = 0.0;
  around("sum_squares", {x}, 0.0, [&] { result = inner().sum_squares(x); });
  return result;
}
double ForwardingBackend::do_sum(Tensor x) {
  double result = 0.0;
  around("sum", {x}, 0.0, [&] { result = inner().sum(x); });
  return result;
}
void ForwardingBackend::do_sum_squares_ranges(Tensor out, Tensor x,
                                              std::span<const SumRange> ranges) {
  around("sum_squares_ranges", {out, x.view(0, {std::min(range_elements(ranges), x.numel())})}, 0.0,
         [&] { inner().sum_squares_ranges(out, x, ranges); });
}
void ForwardingBackend::do_accumulate_mean(Tensor acc, Tensor x) {
  around("accumulate_mean", {acc, x}, 0.0, [&] { inner().accumulate_mean(acc, x); });
}
void ForwardingBackend::do_scalar_add(Tensor out, Tensor a, Tensor b) {
  around("scalar", {out, a, b}, 0.0, [&] { inner().scalar_add(out, a, b); });
}
void ForwardingBackend::do_scalar_divide(Tensor out, Tensor a, double divisor) {
  around("scalar", {out, a}, 0.0, [&] { inner().scalar_divide(out, a, divisor); });
}
void ForwardingBackend::do_scalar_sqrt(Tensor out, Tensor a) {
  around("scalar", {out, a}, 0.0, [&] { inner().scalar_sqrt(out, a); });
}
void ForwardingBackend::do_clip_and_check(Tensor control, Tensor loss, Tensor norm,
                                          double max_norm) {
  around("clip_and_check", {control, loss, norm}, 0.0,
         [&] { inner().clip_and_check(control, loss, norm, max_norm); });
}
void ForwardingBackend::do_multiply(Tensor out, Tensor a, Tensor b) {
  around("multiply", {out, a, b}, 0.0, [&] { inner().multiply(out, a, b); });
}
void ForwardingBackend::do_divide(Tensor out, Tensor a, Tensor b) {
  around("divide", {out, a, b}, 0.0, [&] { inner().divide(out, a, b); });
}
void ForwardingBackend::do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                                bool reciprocal) {
  around("rms_from_sum_squares", {out, sumsq}, 0.0,
         [&] { inner().rms_from_sum_squares(out, sumsq, count, eps, reciprocal); });
}
void ForwardingBackend::do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                                 Tensor targets) {
  around("cross_entropy_forward", {losses, probs, logits, targets}, 0.0,
         [&] { inner().cross_entropy_forward(losses, probs, logits, targets); });
}
void ForwardingBackend::do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                                  float scale) {
  around("cross_entropy_backward", {dlogits, probs, targets}, 0.0,
         [&] { inner().cross_entropy_backward(dlogits, probs, targets, scale); });
}
void ForwardingBackend::do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table,
                                                   int64_t first) {
  around("embedding_shard_forward", {out, out, tokens}, 0.0,
         [&] { inner().embedding_shard_forward(out, tokens, table, first); });
}
void ForwardingBackend::do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                                    int64_t first) {
  around("embedding_shard_backward", {dout, dout, dout, tokens}, 0.0,
         [&] { inner().embedding_shard_backward(dtable, tokens, dout, first); });
}
void ForwardingBackend::do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  around("logits_row_stats", {max, sumexp, logits}, 0.0,
         [&] { inner().logits_row_stats(max, sumexp, logits); });
}
void ForwardingBackend::do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                                        Tensor sumexp, Tensor targets,
                                                        int64_t first, float scale) {
  around("cross_entropy_shard_backward", {dlogits, logits, max, sumexp, targets}, 0.0, [&] {
    inner().cross_entropy_shard_backward(dlogits, logits, max, sumexp, targets, first, scale);
  });
}
void ForwardingBackend::do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                                 float eps) {
  around("rmsnorm_shard_forward", {out, sumsq, x, weight}, 0.0,
         [&] { inner().rmsnorm_shard_forward(out, sumsq, x, weight, eps); });
}
void ForwardingBackend::do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                                  Tensor weight, Tensor rstd, Tensor dot,
                                                  int64_t d) {
  around("rmsnorm_shard_backward", {dx, dx, dweight, dout, x, weight, rstd, dot}, 0.0,
         [&] { inner().rmsnorm_shard_backward(dx, dweight, dout, x, weight, rstd, dot, d); });
}
void ForwardingBackend::do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                                        Tensor local_sumexp, Tensor local_max,
                                                        Tensor max, Tensor logits, Tensor targets,
                                                        int64_t first) {
  around("cross_entropy_shard_partials",
         {sumexp, target_logit, local_sumexp, local_max, max, targets}, 0.0, [&] {
           inner().cross_entropy_shard_partials(sumexp, target_logit, local_sumexp, local_max, max,
                                                logits, targets, first);
         });
}
void ForwardingBackend::do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp,
                                                      Tensor target_logit, Tensor max) {
  around("cross_entropy_shard_losses", {losses, sumexp, target_logit, max}, 0.0,
         [&] { inner().cross_entropy_shard_losses(losses, sumexp, target_logit, max); });
}
void ForwardingBackend::do_scale_rows(Tensor out, Tensor x, Tensor factor) {
  around("scale_rows", {out, x, factor}, 0.0, [&] { inner().scale_rows(out, x, factor); });
}
void ForwardingBackend::do_row_dot(Tensor out, Tensor a, Tensor b) {
  around("row_dot", {out, a, b}, 0.0, [&] { inner().row_dot(out, a, b); });
}
void ForwardingBackend::do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m,
                                        Tensor v, Tensor control, const AdamWArgs& args) {
  around("adamw_update", {param, param, grad, m, m, v, v, compute, control}, 0.0,
         [&] { inner().adamw_update(param, compute, grad, m, v, control, args); });
}

}  // namespace bottle
