#include "core/counting_backend.h"

#include <sys/mman.h>

#include <algorithm>

#include "core/arena.h"
#include "core/error.h"

namespace bottle {

double GemmShape::bytes() const {
  const double mk = double(m) * double(k), kn = double(k) * double(n), mn = double(m) * double(n);
  return double(batch) * (mk * a_size + kn * b_size + mn * c_size * (accumulate ? 2 : 1));
}

double OpCounts::gemm_flops() const {
  double f = 0;
  for (const auto& [shape, calls] : gemms) f += shape.flops() * double(calls);
  return f;
}

double OpCounts::flops() const {
  double f = gemm_flops();
  for (const auto& [name, k] : kernels) f += k.flops;
  return f;
}

void OpCounts::add(const OpCounts& other) {
  for (const auto& [shape, calls] : other.gemms) gemms[shape] += calls;
  for (const auto& [name, k] : other.kernels) {
    KernelCount& mine = kernels[name];
    mine.calls += k.calls;
    mine.flops += k.flops;
    mine.bytes += k.bytes;
  }
}

void CountingBackend::count(const char* kernel, std::initializer_list<Tensor> operands,
                            double flops) {
  KernelCount& k = here().kernels[kernel];
  ++k.calls;
  k.flops += flops;
  for (const Tensor& t : operands) k.bytes += double(t.nbytes());
}

CountingBackend::~CountingBackend() {
  for (const Reservation& r : reservations_) munmap(r.base, r.bytes);
}

void* CountingBackend::allocate(size_t bytes, const char* what) {
  const size_t rounded = aligned_size(std::max<size_t>(bytes, 1));
  if (reservations_.empty() || reservations_.back().bytes - reservations_.back().used < rounded) {
    // Address space only (PROT_NONE, MAP_NORESERVE): 64 GiB at a time, or what one buffer needs
    // where a limit on the address space (ulimit -v) refuses that much.
    void* p = MAP_FAILED;
    size_t size = 0;
    for (size_t want : {std::max<size_t>(rounded, size_t(64) << 30), rounded}) {
      p = mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      size = want;
      if (p != MAP_FAILED) break;
    }
    BOTTLE_CHECK(p != MAP_FAILED, "cannot reserve {} of address space to plan the {}",
                 format_bytes(rounded), what);
    reservations_.push_back({static_cast<char*>(p), size, 0});
  }
  Reservation& r = reservations_.back();
  void* p = r.base + r.used;
  r.used += rounded;
  reserved_ += bytes;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  return p;
}

// The address space is returned when the backend dies: a dry run is short.
void CountingBackend::deallocate(void*, size_t bytes) { reserved_ -= bytes; }

// Staging moves the tensor's bytes over the host link; the dry run has nothing to stage.
void CountingBackend::to_host(void*, Tensor src) {
  ++host_waits_;
  count("to_host", {src});
}
void CountingBackend::from_host(Tensor dst, const void*) { count("from_host", {dst}); }
void CountingBackend::copy(Tensor dst, Tensor src) { count("copy", {dst, src}); }
void CountingBackend::copy_columns(Tensor dst, int64_t, Tensor src, int64_t, int64_t cols) {
  KernelCount& k = here().kernels["copy_columns"];
  ++k.calls;
  k.bytes += 2.0 * double(dst.rows()) * double(cols) * double(dtype_size(dst.dtype));
  (void)src;
}
int64_t CountingBackend::first_outside(Tensor ids, int64_t, int64_t) {
  ++host_waits_;
  count("first_outside", {ids});
  return -1;
}

void CountingBackend::gemm(const GemmArgs& a) {
  const GemmShape shape{a.m,
                        a.n,
                        a.k,
                        a.batch,
                        int(dtype_size(a.a_dtype)),
                        int(dtype_size(a.b_dtype)),
                        int(dtype_size(a.c_dtype)),
                        a.beta != 0.0f};
  ++here().gemms[shape];
}

void CountingBackend::embedding_forward(Tensor out, Tensor tokens, Tensor) {
  count("embedding_forward", {out, out, tokens});  // a row read per token, a row written
}
void CountingBackend::embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) {
  count("embedding_backward", {dout, dout, dout, tokens});  // row read, table row read+written
  (void)dtable;
}
void CountingBackend::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float) {
  count("rmsnorm_forward", {out, rstd, x, weight});
}
void CountingBackend::rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                       Tensor weight, Tensor rstd) {
  count("rmsnorm_backward", {dx, dx, dweight, dout, x, weight, rstd});
}
void CountingBackend::layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x,
                                        Tensor weight, Tensor bias, float) {
  count("layernorm_forward", {out, mean, rstd, x, weight, bias});
}
void CountingBackend::layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout,
                                         Tensor x, Tensor weight, Tensor mean, Tensor rstd) {
  count("layernorm_backward", {dx, dx, dweight, dbias, dout, x, weight, mean, rstd});
}
void CountingBackend::rope_forward(Tensor x, float) { count("rope_forward", {x, x}); }
void CountingBackend::rope_backward(Tensor dx, float) { count("rope_backward", {dx, dx}); }

namespace {
// QKᵀ and PV over the causal triangle: 2 · 2·hd FLOPs per (query head, i, j ≤ i).
double causal_attention_flops(const Tensor& q) {
  const double B = double(q.shape[0]), S = double(q.shape[1]), H = double(q.shape[2]),
               hd = double(q.shape[3]);
  return 4.0 * B * H * hd * S * (S + 1.0) / 2.0;
}
}  // namespace

void CountingBackend::attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  count("attention_forward", {out, lse, q, k, v}, causal_attention_flops(q));
}
void CountingBackend::attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                                         Tensor lse, Tensor q, Tensor k, Tensor v) {
  count("attention_backward", {dq, dq, dk, dk, dv, dv, dout, out, lse, q, k, v},
        2.5 * causal_attention_flops(q));
}
void CountingBackend::silu_forward(Tensor out, Tensor x) { count("silu_forward", {out, x}); }
void CountingBackend::silu_backward(Tensor dx, Tensor dout, Tensor x) {
  count("silu_backward", {dx, dx, dout, x});
}
void CountingBackend::swiglu_forward(Tensor out, Tensor gate, Tensor up, bool) {
  count("swiglu_forward", {out, gate, up});
}
void CountingBackend::swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                                      bool) {
  count("swiglu_backward", {dgate, dgate, dup, dup, dout, gate, up});
}
void CountingBackend::add(Tensor out, Tensor a, Tensor b) { count("add", {out, a, b}); }
void CountingBackend::accumulate(Tensor dst, Tensor src) { count("accumulate", {dst, dst, src}); }
void CountingBackend::fill_zero(Tensor x) { count("fill_zero", {x}); }
void CountingBackend::scale(Tensor x, float) { count("scale", {x, x}); }
double CountingBackend::sum_squares(Tensor x) {
  ++host_waits_;
  count("sum_squares", {x});
  return 0.0;
}
double CountingBackend::sum(Tensor x) {
  ++host_waits_;
  count("sum", {x});
  return 0.0;
}
void CountingBackend::multiply(Tensor out, Tensor a, Tensor b) { count("multiply", {out, a, b}); }
void CountingBackend::divide(Tensor out, Tensor a, Tensor b) { count("divide", {out, a, b}); }
void CountingBackend::rms_from_sum_squares(Tensor out, Tensor sumsq, float, float, bool) {
  count("rms_from_sum_squares", {out, sumsq});
}
void CountingBackend::cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                            Tensor targets) {
  count("cross_entropy_forward", {losses, probs, logits, targets});
}
void CountingBackend::cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets, float) {
  count("cross_entropy_backward", {dlogits, dlogits, probs, targets});
}
void CountingBackend::embedding_shard_forward(Tensor out, Tensor tokens, Tensor, int64_t) {
  count("embedding_shard_forward", {out, out, tokens});
}
void CountingBackend::embedding_shard_backward(Tensor, Tensor tokens, Tensor dout, int64_t) {
  count("embedding_shard_backward", {dout, dout, dout, tokens});
}
void CountingBackend::logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  count("logits_row_stats", {max, sumexp, logits});
}
void CountingBackend::cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                                   Tensor sumexp, Tensor targets, int64_t, float) {
  count("cross_entropy_shard_backward", {dlogits, dlogits, logits, max, sumexp, targets});
}
void CountingBackend::rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                            float) {
  count("rmsnorm_shard_forward", {out, sumsq, x, weight});
}
void CountingBackend::rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                             Tensor weight, Tensor rstd, Tensor dot, int64_t) {
  count("rmsnorm_shard_backward", {dx, dx, dweight, dout, x, weight, rstd, dot});
}
void CountingBackend::cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                                   Tensor local_sumexp, Tensor local_max,
                                                   Tensor max, Tensor logits, Tensor targets,
                                                   int64_t) {
  count("cross_entropy_shard_partials",
        {sumexp, target_logit, local_sumexp, local_max, max, targets});
  (void)logits;  // one logit per row is read
}
void CountingBackend::cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                                 Tensor max) {
  count("cross_entropy_shard_losses", {losses, sumexp, target_logit, max});
}
void CountingBackend::scale_rows(Tensor out, Tensor x, Tensor factor) {
  count("scale_rows", {out, x, factor});
}
void CountingBackend::row_dot(Tensor out, Tensor a, Tensor b) { count("row_dot", {out, a, b}); }
void CountingBackend::adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                                   Tensor control, const AdamWArgs&) {
  // One pass: the masters and moments read and written, the gradient read, the compute copy
  // written.
  count("adamw_update", {param, param, grad, m, m, v, v, compute, control});
}
void CountingBackend::sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) {
  int64_t elements = 0;
  for (const SumRange& r : ranges) elements += r.count;
  count("sum_squares_ranges", {out, x.view(0, {std::min(elements, x.numel())})});
}
void CountingBackend::accumulate_mean(Tensor acc, Tensor x) { count("accumulate_mean", {acc, x}); }
void CountingBackend::scalar_add(Tensor out, Tensor a, Tensor b) { count("scalar", {out, a, b}); }
void CountingBackend::scalar_divide(Tensor out, Tensor a, double) { count("scalar", {out, a}); }
void CountingBackend::scalar_sqrt(Tensor out, Tensor a) { count("scalar", {out, a}); }
void CountingBackend::clip_and_check(Tensor control, Tensor loss, Tensor norm, double) {
  count("clip_and_check", {control, loss, norm});
}

}  // namespace bottle
