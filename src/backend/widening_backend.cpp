#include "backend/widening_backend.h"

#include <algorithm>
#include <cstring>
#include <exception>

#include "core/arena.h"
#include "core/bf16.h"
#include "core/bf16_convert.h"

namespace bottle {
namespace {

using Strided = StridedMatrix;

void widen(float* dst, const uint16_t* src, int64_t n) { widen_bf16_parallel(dst, src, n); }
void narrow(uint16_t* dst, const float* src, int64_t n) { narrow_bf16_parallel(dst, src, n); }
void widen(float* dst, const Strided& m) { widen_matrix(dst, m); }
void narrow(const Strided& m, const float* src) { narrow_matrix(m, src); }
Strided operand(const void* data, DType dtype, int64_t rows, int64_t cols, int64_t ld,
                int64_t batch, int64_t stride) {
  return strided_matrix(data, dtype, rows, cols, ld, batch, stride);
}

}  // namespace

// The fp32 stand-ins of one kernel call's bf16 tensors; outputs are rounded back into their
// bf16 tensors when the call returns (not when it throws: its outputs are then undefined,
// as a failed kernel's are).
class WideningBackend::Widened {
 public:
  explicit Widened(WideningBackend& be)
      : be_(be), first_(be.scratch_in_use_), exceptions_(std::uncaught_exceptions()) {}
  Widened(const Widened&) = delete;
  Widened& operator=(const Widened&) = delete;
  ~Widened() {
    if (std::uncaught_exceptions() == exceptions_)
      for (const auto& [bf16, wide] : outputs_) narrow(bf16, wide);
    be_.scratch_in_use_ = first_;
  }
  // An input: its values in fp32.
  Tensor in(Tensor t) { return wide(t, true, false); }
  // An output the kernel overwrites.
  Tensor out(Tensor t) { return wide(t, false, true); }
  // An output the kernel adds into (or updates in place).
  Tensor inout(Tensor t) { return wide(t, true, true); }
  // A GEMM operand: its compact fp32 stand-in (the operand itself when it is fp32).
  float* matrix(const Strided& m, bool read, bool write) {
    if (m.dtype != DType::bf16) return static_cast<float*>(m.data);
    float* w = be_.scratch(be_.scratch_in_use_++, size_t(m.elements())).data();
    if (read) widen(w, m);
    if (write) outputs_.emplace_back(m, w);
    return w;
  }

 private:
  Tensor wide(Tensor t, bool read, bool write) {
    if (t.dtype != DType::bf16) return t;
    const Strided whole{t.data, t.dtype, 1, t.numel(), t.numel(), 1, 0};
    return Tensor{matrix(whole, read, write), t.shape, DType::f32, t.device};
  }
  WideningBackend& be_;
  size_t first_;
  int exceptions_;
  std::vector<std::pair<Strided, float*>> outputs_;  // (a bf16 output, its fp32 stand-in)
};

WideningBackend::WideningBackend(std::unique_ptr<Backend> inner)
    : ForwardingBackend(std::move(inner)), native_gemm_(this->inner().bf16_gemm_path() != "none") {
  BOTTLE_ASSERT(this->inner().device() == Device::cpu,
                "the widening backend runs host backends only, not '{}'", this->inner().name());
}

WideningBackend::~WideningBackend() {
  for (const auto& b : scratch_)
    MemoryStats::global().sub(MemoryTag::workspace, b.capacity() * sizeof(float));
}

std::vector<float>& WideningBackend::scratch(size_t index, size_t elements) {
  if (index >= scratch_.size()) scratch_.resize(index + 1);
  std::vector<float>& b = scratch_[index];
  if (b.capacity() < elements) {
    MemoryStats::global().sub(MemoryTag::workspace, b.capacity() * sizeof(float));
    b = std::vector<float>(elements);
    MemoryStats::global().add(MemoryTag::workspace, b.capacity() * sizeof(float));
  }
  return b;
}

std::string WideningBackend::bf16_gemm_path() const {
  if (native_gemm_) return inner().bf16_gemm_path();
  return fmt::format(
      "bf16 operands widened to fp32 for the {} backend's fp32 GEMM (it has no "
      "bf16 GEMM on this CPU)",
      inner().name());
}

void WideningBackend::do_copy(Tensor dst, Tensor src) {
  // Same dtypes, and device scalars (f64 and f32), are the inner backend's.
  if (dst.dtype == src.dtype || (dst.dtype != DType::bf16 && src.dtype != DType::bf16))
    return inner().copy(dst, src);
  BOTTLE_ASSERT(dst.numel() == src.numel() &&
                    (dst.dtype == DType::f32 || dst.dtype == DType::bf16) &&
                    (src.dtype == DType::f32 || src.dtype == DType::bf16),
                "{} backend: copy of {} {} into {} {}", name(), dtype_name(src.dtype),
                src.shape.str(), dtype_name(dst.dtype), dst.shape.str());
  if (dst.dtype == DType::bf16)
    narrow(dst.bf16(), src.f32(), src.numel());
  else
    widen(dst.f32(), src.bf16(), src.numel());
}

void WideningBackend::do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                                      int64_t cols) {
  if (dst.dtype == src.dtype) return inner().copy_columns(dst, dst_col, src, src_col, cols);
  Widened w(*this);
  inner().copy_columns(w.inout(dst), dst_col, w.in(src), src_col, cols);
}

void WideningBackend::do_gemm(const GemmArgs& g) {
  if (!g.any_bf16() || (native_gemm_ && g.a_dtype == DType::bf16 && g.b_dtype == DType::bf16))
    return inner().gemm(g);
  if (g.m == 0 || g.n == 0 || g.k == 0 || g.batch == 0) return inner().gemm(g);
  Widened w(*this);
  GemmArgs f = g;
  const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
  const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
  const Strided a = operand(g.a, g.a_dtype, a_rows, a_cols, g.lda, g.batch, g.stride_a);
  const Strided b = operand(g.b, g.b_dtype, b_rows, b_cols, g.ldb, g.batch, g.stride_b);
  const Strided c = operand(g.c, g.c_dtype, g.m, g.n, g.ldc, g.batch, g.stride_c);
  // Each widened operand takes its compact layout's strides.
  auto place = [&](const Strided& m, bool read, bool write, const void*& data, int64_t& ld,
                   int64_t& stride) {
    data = w.matrix(m, read, write);
    if (m.dtype != DType::bf16) return;
    ld = m.cols;
    stride = m.stride == 0 ? 0 : m.rows * m.cols;
  };
  place(a, true, false, f.a, f.lda, f.stride_a);
  place(b, true, false, f.b, f.ldb, f.stride_b);
  const void* c_data = nullptr;
  if (g.reads_other_c()) {
    // C_in shares C's layout and dtype, so both widen to the same compact strides.
    const Strided c_in = operand(g.c_in, g.c_dtype, g.m, g.n, g.ldc, g.batch, g.stride_c);
    int64_t ld = 0, stride = 0;
    place(c_in, true, false, f.c_in, ld, stride);
    place(c, false, true, c_data, f.ldc, f.stride_c);
  } else {
    place(c, g.beta != 0.0f, true, c_data, f.ldc, f.stride_c);
  }
  f.c = const_cast<void*>(c_data);
  f.a_dtype = f.b_dtype = f.c_dtype = DType::f32;
  inner().gemm(f);
}

void WideningBackend::do_embedding_forward(Tensor out, Tensor tokens, Tensor table) {
  Widened w(*this);
  inner().embedding_forward(w.out(out), tokens, w.in(table));
}
void WideningBackend::do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  Widened w(*this);
  inner().embedding_backward(w.inout(dtable), tokens, w.in(dout));
}
void WideningBackend::do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x,
                                                  Tensor residual, Tensor weight, float eps) {
  Widened w(*this);
  inner().residual_rmsnorm_forward(w.out(sum), w.out(out), w.out(rstd), w.in(x), w.in(residual),
                                   w.in(weight), eps);
}
void WideningBackend::do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight,
                                         float eps) {
  Widened w(*this);
  inner().rmsnorm_forward(w.out(out), w.out(rstd), w.in(x), w.in(weight), eps);
}
void WideningBackend::do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                          Tensor weight, Tensor rstd) {
  Widened w(*this);
  inner().rmsnorm_backward(w.inout(dx), w.inout(dweight), w.in(dout), w.in(x), w.in(weight),
                           w.in(rstd));
}
void WideningBackend::do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x,
                                           Tensor weight, Tensor bias, float eps) {
  Widened w(*this);
  inner().layernorm_forward(w.out(out), w.out(mean), w.out(rstd), w.in(x), w.in(weight), w.in(bias),
                            eps);
}
void WideningBackend::do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                                            Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  Widened w(*this);
  inner().layernorm_backward(w.out(dx), w.inout(dweight), w.inout(dbias), w.in(dout), w.in(x),
                             w.in(weight), w.in(mean), w.in(rstd));
}
void WideningBackend::do_rope_forward(Tensor q, Tensor k, float theta) {
  Widened w(*this);
  inner().rope_forward(w.inout(q), w.inout(k), theta);
}
void WideningBackend::do_rope_backward(Tensor dq, Tensor dk, float theta) {
  Widened w(*this);
  inner().rope_backward(w.inout(dq), w.inout(dk), theta);
}
void WideningBackend::do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  Widened w(*this);
  inner().attention_forward(w.out(out), w.out(lse), w.in(q), w.in(k), w.in(v));
}
void WideningBackend::do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout,
                                            Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  Widened w(*this);
  inner().attention_backward(w.out(dq), w.out(dk), w.out(dv), w.in(dout), w.in(out), w.in(lse),
                             w.in(q), w.in(k), w.in(v));
}
void WideningBackend::do_silu_forward(Tensor out, Tensor x) {
  Widened w(*this);
  inner().silu_forward(w.out(out), w.in(x));
}
void WideningBackend::do_silu_backward(Tensor dx, Tensor dout, Tensor x) {
  Widened w(*this);
  inner().silu_backward(w.out(dx), w.in(dout), w.in(x));
}
void WideningBackend::do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) {
  Widened w(*this);
  inner().swiglu_forward(w.out(out), w.in(gate), w.in(up), gate_act);
}
void WideningBackend::do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate,
                                         Tensor up, bool gate_act) {
  Widened w(*this);
  inner().swiglu_backward(w.out(dgate), w.out(dup), w.in(dout), w.in(gate), w.in(up), gate_act);
}
void WideningBackend::do_add(Tensor out, Tensor a, Tensor b) {
  Widened w(*this);
  inner().add(w.out(out), w.in(a), w.in(b));
}
void WideningBackend::do_accumulate(Tensor dst, Tensor src) {
  Widened w(*this);
  inner().accumulate(w.inout(dst), w.in(src));
}
void WideningBackend::do_fill_zero(Tensor x) {
  if (x.dtype != DType::bf16) return inner().fill_zero(x);
  std::memset(x.data, 0, x.nbytes());  // +0 is all zero bits in bf16 as in fp32
}
void WideningBackend::do_scale(Tensor x, float factor) {
  Widened w(*this);
  inner().scale(w.inout(x), factor);
}
double WideningBackend::do_sum_squares(Tensor x) {
  Widened w(*this);
  return inner().sum_squares(w.in(x));
}
void WideningBackend::do_sum_squares_ranges(Tensor out, Tensor x,
                                            std::span<const SumRange> ranges) {
  Widened w(*this);
  inner().sum_squares_ranges(out, w.in(x), ranges);
}
void WideningBackend::do_accumulate_mean(Tensor acc, Tensor x) {
  Widened w(*this);
  inner().accumulate_mean(acc, w.in(x));
}
double WideningBackend::do_sum(Tensor x) {
  Widened w(*this);
  return inner().sum(w.in(x));
}
void WideningBackend::do_multiply(Tensor out, Tensor a, Tensor b) {
  Widened w(*this);
  inner().multiply(w.out(out), w.in(a), w.in(b));
}
void WideningBackend::do_divide(Tensor out, Tensor a, Tensor b) {
  Widened w(*this);
  inner().divide(w.out(out), w.in(a), w.in(b));
}
void WideningBackend::do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                              bool reciprocal) {
  Widened w(*this);
  inner().rms_from_sum_squares(w.out(out), w.in(sumsq), count, eps, reciprocal);
}
void WideningBackend::do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                               Tensor targets) {
  Widened w(*this);
  inner().cross_entropy_forward(w.out(losses), w.out(probs), w.in(logits), targets);
}
void WideningBackend::do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                                float scale) {
  Widened w(*this);
  inner().cross_entropy_backward(w.out(dlogits), w.in(probs), targets, scale);
}
void WideningBackend::do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table,
                                                 int64_t first) {
  Widened w(*this);
  inner().embedding_shard_forward(w.out(out), tokens, w.in(table), first);
}
void WideningBackend::do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                                  int64_t first) {
  Widened w(*this);
  inner().embedding_shard_backward(w.inout(dtable), tokens, w.in(dout), first);
}
void WideningBackend::do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  Widened w(*this);
  inner().logits_row_stats(w.out(max), w.out(sumexp), w.in(logits));
}
void WideningBackend::do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                                      Tensor sumexp, Tensor targets, int64_t first,
                                                      float scale) {
  Widened w(*this);
  inner().cross_entropy_shard_backward(w.out(dlogits), w.in(logits), w.in(max), w.in(sumexp),
                                       targets, first, scale);
}
void WideningBackend::do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                               float eps) {
  Widened w(*this);
  inner().rmsnorm_shard_forward(w.out(out), w.out(sumsq), w.in(x), w.in(weight), eps);
}
void WideningBackend::do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                                Tensor weight, Tensor rstd, Tensor dot, int64_t d) {
  Widened w(*this);
  inner().rmsnorm_shard_backward(w.inout(dx), w.inout(dweight), w.in(dout), w.in(x), w.in(weight),
                                 w.in(rstd), w.in(dot), d);
}
void WideningBackend::do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                                      Tensor local_sumexp, Tensor local_max,
                                                      Tensor max, Tensor logits, Tensor targets,
                                                      int64_t first) {
  Widened w(*this);
  // sumexp may alias local_max: both are statistics, fp32 (never widened apart).
  inner().cross_entropy_shard_partials(w.out(sumexp), w.out(target_logit), w.in(local_sumexp),
                                       w.in(local_max), w.in(max), w.in(logits), targets, first);
}
void WideningBackend::do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp,
                                                    Tensor target_logit, Tensor max) {
  Widened w(*this);
  inner().cross_entropy_shard_losses(w.out(losses), w.in(sumexp), w.in(target_logit), w.in(max));
}
void WideningBackend::do_scale_rows(Tensor out, Tensor x, Tensor factor) {
  Widened w(*this);
  inner().scale_rows(w.out(out), w.in(x), w.in(factor));
}
void WideningBackend::do_row_dot(Tensor out, Tensor a, Tensor b) {
  Widened w(*this);
  inner().row_dot(w.out(out), w.in(a), w.in(b));
}

}  // namespace bottle
