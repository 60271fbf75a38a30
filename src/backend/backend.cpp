// The checks of every Backend op, made once for every backend before its implementation runs:
// that each tensor lives where the backend computes, the dtypes an op takes, the element
// counts its operands must agree on. An implementation checks only what is its own (a dtype
// its kernels lack, a limit of its kernels). Messages name the backend and the op.
#include "backend/backend.h"

#include <fmt/format.h>

#include <type_traits>
#include <utility>

namespace bottle {
namespace {
// A shape in an OpCheck message, formatted only when the check fails: the checks run before
// every op, and formatting their shapes up front took a tenth of `bottle plan`'s dry runs.
struct ShapeText {
  const Shape& shape;
};
}  // namespace
}  // namespace bottle

template <>
struct fmt::formatter<bottle::ShapeText> : fmt::formatter<std::string_view> {
  auto format(const bottle::ShapeText& t, fmt::format_context& ctx) const {
    return fmt::formatter<std::string_view>::format(t.shape.str(), ctx);
  }
};

namespace bottle {

GemmArgs GemmArgs::item(int64_t i) const {
  const auto offset = [i](auto* p, int64_t stride, DType t) {
    using Byte =
        std::conditional_t<std::is_const_v<std::remove_pointer_t<decltype(p)>>, const char, char>;
    return p ? static_cast<decltype(p)>(static_cast<Byte*>(p) + i * stride * int64_t(dtype_size(t)))
             : p;
  };
  GemmArgs one = *this;
  one.a = offset(a, stride_a, a_dtype);
  one.b = offset(b, stride_b, b_dtype);
  one.c = offset(c, stride_c, c_dtype);
  one.c_in = offset(c_in, stride_c, c_dtype);
  one.batch = 1;
  one.stride_a = one.stride_b = one.stride_c = 0;
  return one;
}

namespace {

// The device-scalar and AdamW operands: f64 one-element scalars, an f32 control tensor,
// ranges inside x, ascending no-decay ranges.
void check_scalar(const char* backend, const char* op, const Tensor& t, const char* what) {
  BOTTLE_CHECK(t.dtype == DType::f64 && t.numel() == 1 && t.data != nullptr,
               "{} backend: {}: {} must be one f64 element, not {} {}", backend, op, what,
               dtype_name(t.dtype), t.shape.str());
}

void check_sum_ranges(const char* backend, const Tensor& out, const Tensor& x,
                      std::span<const SumRange> ranges) {
  BOTTLE_CHECK(out.dtype == DType::f64 && out.numel() >= 1 && out.data != nullptr,
               "{} backend: sum_squares_ranges: out must be f64, not {} {}", backend,
               dtype_name(out.dtype), out.shape.str());
  BOTTLE_CHECK(x.dtype == DType::f32 || x.dtype == DType::bf16,
               "{} backend: sum_squares_ranges takes an f32 or bf16 buffer, not {} {}", backend,
               dtype_name(x.dtype), x.shape.str());
  for (const SumRange& r : ranges)
    BOTTLE_CHECK(r.offset >= 0 && r.count >= 0 && r.offset + r.count <= x.numel() && r.slot >= 0 &&
                     r.slot < out.numel(),
                 "{} backend: sum_squares_ranges: range [{}, {}) into slot {} outside a buffer "
                 "of {} elements and {} slots",
                 backend, r.offset, r.offset + r.count, r.slot, x.numel(), out.numel());
}

void check_control(const char* backend, const char* op, const Tensor& control) {
  BOTTLE_CHECK(
      control.dtype == DType::f32 && control.numel() == kStepControlSize && control.data != nullptr,
      "{} backend: {}: the control tensor must be f32 [{}], not {} {}", backend, op,
      kStepControlSize, dtype_name(control.dtype), control.shape.str());
}

void check_adamw(const char* backend, Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                 Tensor control, const AdamWArgs& args) {
  const int64_t n = param.numel();
  for (const auto& [t, what] : {std::pair{&param, "param"}, {&grad, "grad"}, {&m, "m"}, {&v, "v"}})
    BOTTLE_CHECK(t->dtype == DType::f32 && t->numel() == n,
                 "{} backend: adamw_update: {} must be f32 with {} elements (param's), not {} {}",
                 backend, what, n, dtype_name(t->dtype), t->shape.str());
  BOTTLE_CHECK(compute.empty() || ((compute.dtype == DType::f32 || compute.dtype == DType::bf16) &&
                                   compute.numel() == n),
               "{} backend: adamw_update: the compute copy must be f32 or bf16 with {} elements, "
               "not {} {}",
               backend, n, dtype_name(compute.dtype), compute.shape.str());
  if (!control.empty()) check_control(backend, "adamw_update", control);
  BOTTLE_CHECK(args.step >= 1, "{} backend: adamw_update: step must be >= 1, got {}", backend,
               args.step);
  int64_t end = 0;
  for (const ElementRange& r : args.no_decay) {
    BOTTLE_CHECK(r.offset >= end && r.count >= 0 && r.offset + r.count <= n,
                 "{} backend: adamw_update: no-decay range [{}, {}) is not ascending inside [0, "
                 "{})",
                 backend, r.offset, r.offset + r.count, n);
    end = r.offset + r.count;
  }
}

class OpCheck {
 public:
  OpCheck(const Backend& be, const char* op) : be_(be), op_(op), name_(be.name()) {}
  const char* backend() const { return name_.data(); }

  template <typename... Args>
  void check(bool ok, fmt::format_string<Args...> format, Args&&... args) const {
    if (!ok)
      fail("{} backend: {}: {}", name_, op_, fmt::format(format, std::forward<Args>(args)...));
  }
  // Tensors of another device reaching this backend are a bug in the caller: every tensor of
  // a run comes from an arena of its backend.
  void here(std::initializer_list<Tensor> ts) const {
    for (const Tensor& t : ts) {
      check(t.numel() == 0 || t.data != nullptr, "a tensor {} without data", ShapeText{t.shape});
      check(t.numel() == 0 || t.device == be_.device(),
            "got a {} tensor {}: only tensors in {} memory reach its kernels",
            device_name(t.device), ShapeText{t.shape}, device_name(be_.device()));
    }
  }
  // An operand the op may go without (Tensor{}, no data).
  void here_optional(std::initializer_list<Tensor> ts) const {
    for (const Tensor& t : ts)
      if (!t.empty()) here({t});
  }
  static bool is_float(const Tensor& t) { return t.dtype == DType::f32 || t.dtype == DType::bf16; }
  void floats(std::initializer_list<Tensor> ts) const {
    for (const Tensor& t : ts)
      check(t.empty() || is_float(t), "takes f32 or bf16 tensors, not {} {}", dtype_name(t.dtype),
            ShapeText{t.shape});
  }
  void ids(const Tensor& t, const char* what) const {
    check(t.dtype == DType::i32, "{} must be i32 ids, not {} {}", what, dtype_name(t.dtype),
          ShapeText{t.shape});
  }
  void numel(const Tensor& t, int64_t n, const char* what) const {
    check(t.numel() == n, "{} has {} elements {}, expected {}", what, t.numel(), ShapeText{t.shape},
          n);
  }
  void optional_numel(const Tensor& t, int64_t n, const char* what) const {
    if (!t.empty()) numel(t, n, what);
  }
  void same_numel(const Tensor& t, const Tensor& like, const char* what) const {
    numel(t, like.numel(), what);
  }
  // Same element count everywhere (an elementwise op).
  void elementwise(std::initializer_list<Tensor> ts) const {
    here(ts);
    floats(ts);
    for (const Tensor& t : ts) numel(t, ts.begin()->numel(), "an operand");
  }
  // An embedding's rows: one row of the table's width per token, forward or backward.
  void embedding(const Tensor& rows, const Tensor& tokens, const Tensor& table,
                 const char* what) const {
    here({rows, tokens, table});
    floats({rows, table});
    ids(tokens, "tokens");
    numel(rows, tokens.numel() * table.cols(), what);
  }
  void rope(const Tensor& q, const Tensor& k) const {
    check(q.shape.rank == 4 && q.shape[3] % 2 == 0 && k.shape.rank == 4 &&
              k.shape[0] == q.shape[0] && k.shape[1] == q.shape[1] && k.shape[3] == q.shape[3],
          "takes q [B, S, H, head_dim] and k [B, S, Hkv, head_dim] with an even head_dim, not "
          "{} and {}",
          ShapeText{q.shape}, ShapeText{k.shape});
  }
  void attention(const Tensor& q, const Tensor& k, const Tensor& v) const {
    check(q.shape.rank == 4 && k.shape.rank == 4 && k.shape == v.shape &&
              q.shape[0] == k.shape[0] && q.shape[1] == k.shape[1] && q.shape[3] == k.shape[3] &&
              k.shape[2] > 0 && q.shape[2] % k.shape[2] == 0,
          "q {} with k {} and v {} (want [B, S, H, hd] and [B, S, Hkv, hd], H a multiple of "
          "Hkv)",
          ShapeText{q.shape}, ShapeText{k.shape}, ShapeText{v.shape});
  }

 private:
  const Backend& be_;
  const char* op_;
  std::string_view name_;
};

}  // namespace

void Backend::to_host(void* dst, Tensor src) {
  const OpCheck c(*this, "to_host");
  c.here({src});
  do_to_host(dst, src);
}

void Backend::from_host(Tensor dst, const void* src) {
  const OpCheck c(*this, "from_host");
  c.here({dst});
  do_from_host(dst, src);
}

void Backend::copy(Tensor dst, Tensor src) {
  const OpCheck c(*this, "copy");
  c.here({dst, src});
  c.same_numel(dst, src, "dst");
  c.check(dst.dtype == src.dtype || (c.is_float(dst) && c.is_float(src)) ||
              (dst.dtype == DType::f64 && src.dtype == DType::f32) ||
              (dst.dtype == DType::f32 && src.dtype == DType::f64),
          "copy of {} into {}", dtype_name(src.dtype), dtype_name(dst.dtype));
  do_copy(dst, src);
}

void Backend::copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t cols) {
  const OpCheck c(*this, "copy_columns");
  c.here({dst, src});
  c.check(dst.rows() == src.rows() && cols >= 0 && dst_col >= 0 && src_col >= 0 &&
              dst_col + cols <= dst.cols() && src_col + cols <= src.cols() &&
              (dst.dtype == src.dtype || (c.is_float(dst) && c.is_float(src))),
          "{} columns from column {} of {} {} into column {} of {} {}", cols, src_col,
          dtype_name(src.dtype), ShapeText{src.shape}, dst_col, dtype_name(dst.dtype),
          ShapeText{dst.shape});
  do_copy_columns(dst, dst_col, src, src_col, cols);
}

int64_t Backend::first_outside(Tensor ids, int64_t lo, int64_t hi) {
  const OpCheck c(*this, "first_outside");
  c.here({ids});
  c.ids(ids, "ids");
  return do_first_outside(ids, lo, hi);
}

void Backend::gemm(const GemmArgs& args) {
  const OpCheck c(*this, "gemm");
  c.check(args.m >= 0 && args.n >= 0 && args.k >= 0 && args.batch >= 1, "m {} n {} k {} batch {}",
          args.m, args.n, args.k, args.batch);
  for (const DType t : {args.a_dtype, args.b_dtype, args.c_dtype})
    c.check(t == DType::f32 || t == DType::bf16, "a {} operand (f32 or bf16 only)", dtype_name(t));
  do_gemm(args);
}

void Backend::embedding_forward(Tensor out, Tensor tokens, Tensor table) {
  const OpCheck c(*this, "embedding_forward");
  c.embedding(out, tokens, table, "out");
  do_embedding_forward(out, tokens, table);
}

void Backend::embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  const OpCheck c(*this, "embedding_backward");
  c.embedding(dout, tokens, dtable, "dout");
  do_embedding_backward(dtable, tokens, dout);
}

void Backend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) {
  const OpCheck c(*this, "rmsnorm_forward");
  c.here({out, x, weight});
  c.here_optional({rstd});
  c.floats({out, rstd, x, weight});
  c.numel(out, x.numel(), "out");
  c.numel(weight, x.cols(), "weight");
  c.optional_numel(rstd, x.rows(), "rstd");
  do_rmsnorm_forward(out, rstd, x, weight, eps);
}

void Backend::residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x,
                                       Tensor residual, Tensor weight, float eps) {
  const OpCheck c(*this, "residual_rmsnorm_forward");
  c.here({sum, out, rstd, x, residual, weight});
  c.floats({sum, out, rstd, x, residual, weight});
  for (const auto& [t, what] : {std::pair{&sum, "sum"}, {&out, "out"}, {&residual, "residual"}})
    c.numel(*t, x.numel(), what);
  c.numel(weight, x.cols(), "weight");
  c.numel(rstd, x.rows(), "rstd");
  c.check(sum.numel() == 0 || (sum.data != x.data && sum.data != residual.data),
          "sum aliases an input (the fused op reads x and residual twice)");
  do_residual_rmsnorm_forward(sum, out, rstd, x, residual, weight, eps);
}

void Backend::rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                               Tensor rstd) {
  const OpCheck c(*this, "rmsnorm_backward");
  c.here({dx, dweight, dout, x, weight, rstd});
  c.floats({dx, dweight, dout, x, weight, rstd});
  c.numel(dx, x.numel(), "dx");
  c.numel(dout, x.numel(), "dout");
  c.numel(dweight, x.cols(), "dweight");
  c.numel(weight, x.cols(), "weight");
  c.numel(rstd, x.rows(), "rstd");
  do_rmsnorm_backward(dx, dweight, dout, x, weight, rstd);
}

void Backend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                                Tensor bias, float eps) {
  const OpCheck c(*this, "layernorm_forward");
  c.here({out, mean, rstd, x, weight, bias});
  c.floats({out, mean, rstd, x, weight, bias});
  c.numel(out, x.numel(), "out");
  c.numel(weight, x.cols(), "weight");
  c.numel(bias, x.cols(), "bias");
  c.numel(mean, x.rows(), "mean");
  c.numel(rstd, x.rows(), "rstd");
  do_layernorm_forward(out, mean, rstd, x, weight, bias, eps);
}

void Backend::layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                                 Tensor weight, Tensor mean, Tensor rstd) {
  const OpCheck c(*this, "layernorm_backward");
  c.here({dx, dweight, dbias, dout, x, weight, mean, rstd});
  c.floats({dx, dweight, dbias, dout, x, weight, mean, rstd});
  c.numel(dx, x.numel(), "dx");
  c.numel(dout, x.numel(), "dout");
  c.numel(dweight, x.cols(), "dweight");
  c.numel(dbias, x.cols(), "dbias");
  c.numel(weight, x.cols(), "weight");
  c.numel(mean, x.rows(), "mean");
  c.numel(rstd, x.rows(), "rstd");
  do_layernorm_backward(dx, dweight, dbias, dout, x, weight, mean, rstd);
}

void Backend::rope_forward(Tensor q, Tensor k, float theta) {
  const OpCheck c(*this, "rope_forward");
  c.here({q, k});
  c.floats({q, k});
  c.rope(q, k);
  do_rope_forward(q, k, theta);
}

void Backend::rope_backward(Tensor dq, Tensor dk, float theta) {
  const OpCheck c(*this, "rope_backward");
  c.here({dq, dk});
  c.floats({dq, dk});
  c.rope(dq, dk);
  do_rope_backward(dq, dk, theta);
}

void Backend::attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  const OpCheck c(*this, "attention_forward");
  c.here({out, lse, q, k, v});
  c.floats({out, lse, q, k, v});
  c.attention(q, k, v);
  c.numel(out, q.numel(), "out");
  c.numel(lse, q.shape[0] * q.shape[2] * q.shape[1], "lse");
  do_attention_forward(out, lse, q, k, v);
}

void Backend::attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                                 Tensor lse, Tensor q, Tensor k, Tensor v) {
  const OpCheck c(*this, "attention_backward");
  c.here({dq, dk, dv, dout, out, lse, q, k, v});
  c.floats({dq, dk, dv, dout, out, lse, q, k, v});
  c.attention(q, k, v);
  c.numel(dq, q.numel(), "dq");
  c.numel(dout, q.numel(), "dout");
  c.numel(out, q.numel(), "out");
  c.numel(dk, k.numel(), "dk");
  c.numel(dv, v.numel(), "dv");
  c.numel(lse, q.shape[0] * q.shape[2] * q.shape[1], "lse");
  do_attention_backward(dq, dk, dv, dout, out, lse, q, k, v);
}

void Backend::silu_forward(Tensor out, Tensor x) {
  const OpCheck c(*this, "silu_forward");
  c.elementwise({out, x});
  do_silu_forward(out, x);
}

void Backend::silu_backward(Tensor dx, Tensor dout, Tensor x) {
  const OpCheck c(*this, "silu_backward");
  c.elementwise({dx, dout, x});
  do_silu_backward(dx, dout, x);
}

void Backend::swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) {
  const OpCheck c(*this, "swiglu_forward");
  c.elementwise({out, gate, up});
  do_swiglu_forward(out, gate, up, gate_act);
}

void Backend::swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                              bool gate_act) {
  const OpCheck c(*this, "swiglu_backward");
  c.elementwise({dgate, dup, dout, gate, up});
  do_swiglu_backward(dgate, dup, dout, gate, up, gate_act);
}

void Backend::add(Tensor out, Tensor a, Tensor b) {
  const OpCheck c(*this, "add");
  c.elementwise({out, a, b});
  do_add(out, a, b);
}

void Backend::accumulate(Tensor dst, Tensor src) {
  const OpCheck c(*this, "accumulate");
  c.elementwise({dst, src});
  do_accumulate(dst, src);
}

void Backend::fill_zero(Tensor x) {
  const OpCheck c(*this, "fill_zero");
  c.here({x});
  do_fill_zero(x);
}

void Backend::scale(Tensor x, float factor) {
  const OpCheck c(*this, "scale");
  c.here({x});
  c.floats({x});
  do_scale(x, factor);
}

double Backend::sum_squares(Tensor x) {
  const OpCheck c(*this, "sum_squares");
  c.here({x});
  c.floats({x});
  return do_sum_squares(x);
}

double Backend::sum(Tensor x) {
  const OpCheck c(*this, "sum");
  c.here({x});
  c.floats({x});
  return do_sum(x);
}

void Backend::sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) {
  const OpCheck c(*this, "sum_squares_ranges");
  c.here({out, x});
  check_sum_ranges(c.backend(), out, x, ranges);
  do_sum_squares_ranges(out, x, ranges);
}

void Backend::accumulate_mean(Tensor acc, Tensor x) {
  const OpCheck c(*this, "accumulate_mean");
  c.here({acc, x});
  check_scalar(c.backend(), "accumulate_mean", acc, "acc");
  c.floats({x});
  c.check(x.numel() > 0, "the mean of an empty tensor");
  do_accumulate_mean(acc, x);
}

void Backend::scalar_add(Tensor out, Tensor a, Tensor b) {
  const OpCheck c(*this, "scalar_add");
  c.here({out, a, b});
  for (const auto& [t, what] : {std::pair{&out, "out"}, {&a, "a"}, {&b, "b"}})
    check_scalar(c.backend(), "scalar_add", *t, what);
  do_scalar_add(out, a, b);
}

void Backend::scalar_divide(Tensor out, Tensor a, double divisor) {
  const OpCheck c(*this, "scalar_divide");
  c.here({out, a});
  check_scalar(c.backend(), "scalar_divide", out, "out");
  check_scalar(c.backend(), "scalar_divide", a, "a");
  do_scalar_divide(out, a, divisor);
}

void Backend::scalar_sqrt(Tensor out, Tensor a) {
  const OpCheck c(*this, "scalar_sqrt");
  c.here({out, a});
  check_scalar(c.backend(), "scalar_sqrt", out, "out");
  check_scalar(c.backend(), "scalar_sqrt", a, "a");
  do_scalar_sqrt(out, a);
}

void Backend::clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) {
  const OpCheck c(*this, "clip_and_check");
  c.here({control, loss, norm});
  check_control(c.backend(), "clip_and_check", control);
  check_scalar(c.backend(), "clip_and_check", loss, "loss");
  check_scalar(c.backend(), "clip_and_check", norm, "norm");
  do_clip_and_check(control, loss, norm, max_norm);
}

void Backend::multiply(Tensor out, Tensor a, Tensor b) {
  const OpCheck c(*this, "multiply");
  c.elementwise({out, a, b});
  do_multiply(out, a, b);
}

void Backend::divide(Tensor out, Tensor a, Tensor b) {
  const OpCheck c(*this, "divide");
  c.elementwise({out, a, b});
  do_divide(out, a, b);
}

void Backend::rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                   bool reciprocal) {
  const OpCheck c(*this, "rms_from_sum_squares");
  c.elementwise({out, sumsq});
  do_rms_from_sum_squares(out, sumsq, count, eps, reciprocal);
}

void Backend::cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits, Tensor targets) {
  const OpCheck c(*this, "cross_entropy_forward");
  c.here({losses, probs, logits, targets});
  c.floats({losses, probs, logits});
  c.ids(targets, "targets");
  c.numel(losses, logits.rows(), "losses");
  c.numel(probs, logits.numel(), "probs");
  c.numel(targets, logits.rows(), "targets");
  do_cross_entropy_forward(losses, probs, logits, targets);
}

void Backend::cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets, float scale) {
  const OpCheck c(*this, "cross_entropy_backward");
  c.here({dlogits, probs, targets});
  c.floats({dlogits, probs});
  c.ids(targets, "targets");
  c.numel(dlogits, probs.numel(), "dlogits");
  c.numel(targets, probs.rows(), "targets");
  do_cross_entropy_backward(dlogits, probs, targets, scale);
}

void Backend::embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) {
  const OpCheck c(*this, "embedding_shard_forward");
  c.embedding(out, tokens, table, "out");
  do_embedding_shard_forward(out, tokens, table, first);
}

void Backend::embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout, int64_t first) {
  const OpCheck c(*this, "embedding_shard_backward");
  c.embedding(dout, tokens, dtable, "dout");
  do_embedding_shard_backward(dtable, tokens, dout, first);
}

void Backend::logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  const OpCheck c(*this, "logits_row_stats");
  c.here({max, sumexp, logits});
  c.floats({max, sumexp, logits});
  c.numel(max, logits.rows(), "max");
  c.numel(sumexp, logits.rows(), "sumexp");
  do_logits_row_stats(max, sumexp, logits);
}

void Backend::cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                           Tensor targets, int64_t first, float scale) {
  const OpCheck c(*this, "cross_entropy_shard_backward");
  c.here({dlogits, logits, max, sumexp, targets});
  c.floats({dlogits, logits, max, sumexp});
  c.ids(targets, "targets");
  c.numel(dlogits, logits.numel(), "dlogits");
  for (const auto& [t, what] : {std::pair{&max, "max"}, {&sumexp, "sumexp"}, {&targets, "targets"}})
    c.numel(*t, logits.rows(), what);
  do_cross_entropy_shard_backward(dlogits, logits, max, sumexp, targets, first, scale);
}

void Backend::rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight, float eps) {
  const OpCheck c(*this, "rmsnorm_shard_forward");
  c.here({out, x, weight});
  c.here_optional({sumsq});
  c.floats({out, sumsq, x, weight});
  c.numel(out, x.numel(), "out");
  c.numel(weight, x.cols(), "weight");
  c.optional_numel(sumsq, x.rows(), "sumsq");
  do_rmsnorm_shard_forward(out, sumsq, x, weight, eps);
}

void Backend::rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                     Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  const OpCheck c(*this, "rmsnorm_shard_backward");
  c.here({dx, dweight, dout, x, weight, rstd});
  c.here_optional({dot});
  c.floats({dx, dweight, dout, x, weight, rstd, dot});
  c.numel(dx, x.numel(), "dx");
  c.numel(dout, x.numel(), "dout");
  c.numel(dweight, x.cols(), "dweight");
  c.numel(weight, x.cols(), "weight");
  c.numel(rstd, x.rows(), "rstd");
  c.optional_numel(dot, x.rows(), "dot");
  c.check(d >= x.cols(), "a slice of {} columns of a row of {}", x.cols(), d);
  do_rmsnorm_shard_backward(dx, dweight, dout, x, weight, rstd, dot, d);
}

void Backend::cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                           Tensor local_max, Tensor max, Tensor logits,
                                           Tensor targets, int64_t first) {
  const OpCheck c(*this, "cross_entropy_shard_partials");
  c.here({sumexp, target_logit, local_sumexp, local_max, max, logits, targets});
  c.floats({sumexp, target_logit, local_sumexp, local_max, max, logits});
  c.ids(targets, "targets");
  for (const auto& [t, what] : {std::pair{&sumexp, "sumexp"},
                                {&target_logit, "target_logit"},
                                {&local_sumexp, "local_sumexp"},
                                {&local_max, "local_max"},
                                {&max, "max"},
                                {&targets, "targets"}})
    c.numel(*t, logits.rows(), what);
  do_cross_entropy_shard_partials(sumexp, target_logit, local_sumexp, local_max, max, logits,
                                  targets, first);
}

void Backend::cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                         Tensor max) {
  const OpCheck c(*this, "cross_entropy_shard_losses");
  c.elementwise({losses, sumexp, target_logit, max});
  do_cross_entropy_shard_losses(losses, sumexp, target_logit, max);
}

void Backend::scale_rows(Tensor out, Tensor x, Tensor factor) {
  const OpCheck c(*this, "scale_rows");
  c.here({out, x, factor});
  c.floats({out, x, factor});
  c.numel(out, x.numel(), "out");
  c.numel(factor, x.rows(), "factor");
  do_scale_rows(out, x, factor);
}

void Backend::row_dot(Tensor out, Tensor a, Tensor b) {
  const OpCheck c(*this, "row_dot");
  c.here({out, a, b});
  c.floats({out, a, b});
  c.numel(b, a.numel(), "b");
  c.numel(out, a.rows(), "out");
  do_row_dot(out, a, b);
}

void Backend::adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                           Tensor control, const AdamWArgs& args) {
  const OpCheck c(*this, "adamw_update");
  c.here({param, grad, m, v});
  c.here_optional({compute, control});
  check_adamw(c.backend(), param, compute, grad, m, v, control, args);
  do_adamw_update(param, compute, grad, m, v, control, args);
}

namespace {

// Muon's element-wise operands: f32 of one element count.
void check_muon_operands(const char* backend, const char* op,
                         std::initializer_list<std::pair<const Tensor*, const char*>> operands) {
  const int64_t n = operands.begin()->first->numel();
  for (const auto& [t, what] : operands)
    BOTTLE_CHECK(t->dtype == DType::f32 && t->numel() == n,
                 "{} backend: {}: {} must be f32 with {} elements, not {} {}", backend, op, what, n,
                 dtype_name(t->dtype), t->shape.str());
}

}  // namespace

void Backend::muon_momentum(Tensor update, Tensor buffer, Tensor grad, Tensor control,
                            const MuonArgs& args) {
  const OpCheck c(*this, "muon_momentum");
  c.here({update, buffer, grad});
  c.here_optional({control});
  check_muon_operands(c.backend(), "muon_momentum",
                      {{&update, "update"}, {&buffer, "buffer"}, {&grad, "grad"}});
  if (!control.empty()) check_control(c.backend(), "muon_momentum", control);
  do_muon_momentum(update, buffer, grad, control, args);
}

void Backend::muon_normalize(Tensor x, Tensor sumsq) {
  const OpCheck c(*this, "muon_normalize");
  c.here({x, sumsq});
  check_muon_operands(c.backend(), "muon_normalize", {{&x, "x"}});
  c.check(sumsq.dtype == DType::f32 && sumsq.numel() == 1, "sumsq must be f32 [1], not {} {}",
          dtype_name(sumsq.dtype), ShapeText{sumsq.shape});
  do_muon_normalize(x, sumsq);
}

void Backend::muon_apply(Tensor param, Tensor compute, Tensor update, Tensor control,
                         const MuonArgs& args) {
  const OpCheck c(*this, "muon_apply");
  c.here({param, update});
  c.here_optional({compute, control});
  check_muon_operands(c.backend(), "muon_apply", {{&param, "param"}, {&update, "update"}});
  c.check(compute.empty() || ((compute.dtype == DType::f32 || compute.dtype == DType::bf16) &&
                              compute.numel() == param.numel()),
          "the compute copy must be f32 or bf16 with {} elements, not {} {}", param.numel(),
          dtype_name(compute.dtype), ShapeText{compute.shape});
  if (!control.empty()) check_control(c.backend(), "muon_apply", control);
  do_muon_apply(param, compute, update, control, args);
}

}  // namespace bottle
