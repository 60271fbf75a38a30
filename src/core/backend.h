#pragma once
// The kernel interface every layer calls. Layer code never knows which backend runs it:
// `cpu` (oneDNN GEMMs + OpenMP loops), `reference` (naive loops, used by tests as the
// oracle), `cuda` (kernels of src/core/cuda, cuBLASLt GEMMs). Tensors carry their dtype; a backend
// rejects dtypes it lacks.
//
// The backend owns memory: arenas ask it for their blocks, and only backends read or write
// tensor data. Layers, the model and the trainer move data with copy / copy_columns, reduce
// with sum / sum_squares, and stage host data in and out with from_host / to_host
// (checkpoint I/O, the data loader, metrics, sampling), so a device backend runs them all.
//
// Conventions:
// - Row-major; "rows" are all leading dims flattened, "cols" the last dim.
// - Activation gradients are written, parameter gradients accumulated (docs/design.md §11).
//   A *_backward kernel WRITES each input gradient that it alone produces: silu_backward's dx,
//   swiglu_backward's dgate and dup, layernorm_backward's dx, attention_backward's dq, dk and
//   dv, the cross-entropies' dlogits. It ADDS into every parameter gradient (dweight, dbias,
//   dtable; a GEMM's C with beta = 1) and into the input gradients that have more than one
//   producer: rmsnorm_backward's and rmsnorm_shard_backward's dx (the residual stream's
//   gradient, where the norm's share joins the skip connection's). So no caller zero-fills a
//   buffer a kernel writes, and no kernel reads what it is about to overwrite.
// - Tensors passed as outputs of a forward kernel are overwritten.
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace bottle {

// C[i] = alpha * op(A[i]) * op(B[i]) + beta * C_in[i], i < batch, row-major.
// op(A) is m x k, op(B) is k x n, C is m x n. lda/ldb/ldc are row strides of the stored
// matrices (A stored k x m when trans_a); stride_* are batch strides, in elements.
// C_in is C itself unless c_in is given: then it is read there, laid out like C (ldc,
// stride_c, c_dtype), and C is only written. A residual add then rides in the GEMM's
// epilogue (y = u Bᵀ + x), rounded once with the product, instead of a kernel of its own.
// Each operand has its dtype: bf16 operands are multiplied exactly and summed in fp32, and a
// bf16 C receives the fp32 result rounded to nearest even (docs/design.md, mixed precision).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  const void* c_in = nullptr;  // null: C_in is c
  int64_t batch = 1;
  DType a_dtype = DType::f32, b_dtype = DType::f32, c_dtype = DType::f32;
  // The operands' dtypes from the tensors they come from.
  void dtypes_of(const Tensor& a, const Tensor& b, const Tensor& c) {
    a_dtype = a.dtype, b_dtype = b.dtype, c_dtype = c.dtype;
  }
  bool any_bf16() const {
    return a_dtype == DType::bf16 || b_dtype == DType::bf16 || c_dtype == DType::bf16;
  }
  // Whether C_in is read from memory other than C.
  bool reads_other_c() const { return c_in != nullptr && c_in != c && beta != 0.0f; }
  const void* c_read() const { return c_in ? c_in : c; }
  // Item i of the batch as a GEMM of its own (batch 1), its operands offset by the strides
  // (0 for a broadcast operand): what a backend runs item by item where it has no batched
  // kernel for these strides.
  GemmArgs item(int64_t i) const;
};

// A range [offset, offset + count) of a flat buffer, in elements.
struct ElementRange {
  int64_t offset = 0, count = 0;
  bool operator==(const ElementRange&) const = default;
};

// One range of a flat buffer whose squares add into out[slot] (sum_squares_ranges).
struct SumRange {
  int64_t offset = 0, count = 0;
  int slot = 0;
  bool operator==(const SumRange&) const = default;
};

struct AdamWArgs {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
  float grad_scale = 1.0f;  // applied to the gradient first, when no control tensor is given
  int64_t step = 1;         // 1-based, for bias correction
  // Ranges of the buffer (offsets from its start, ascending, disjoint) that take no weight
  // decay: norm weights. The rest decays by weight_decay.
  std::span<const ElementRange> no_decay;
};

// What clip_and_check writes into a step's control tensor (f32 [kStepControlSize]), which
// adamw_update reads on the device.
inline constexpr int kControlScale = 0;  // the gradient's factor (clipping)
inline constexpr int kControlApply = 1;  // 1: update; 0: a non-finite step, skipped
inline constexpr int kStepControlSize = 2;

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;

  // --- bf16 (training.precision = "bf16"). Every kernel below takes bf16 tensors for its
  // activations where this is empty; else it is the reason the backend cannot.
  virtual std::string bf16_unsupported() const { return "it has no bf16 kernels"; }
  // How bf16 GEMMs run, for `bench step`, e.g. "oneDNN bf16 matmul (avx512_core_amx)".
  virtual std::string bf16_gemm_path() const { return "none"; }

  // --- Memory.
  virtual Device device() const = 0;
  // The device stream this backend's kernels run on, as its native handle (a cudaStream_t for
  // cuda), so that a device communicator orders its own stream against it; null for the host
  // backends, whose kernels finish before they return.
  virtual void* native_stream() const { return nullptr; }
  // Waits until every kernel issued so far has finished: a device backend runs them
  // asynchronously (timings, MFU); a host backend's kernels finish before they return.
  virtual void synchronize() {}
  // How many times this backend has made the host wait for the device so far: stream
  // synchronisations and device-to-host copies (to_host, first_outside, sum, sum_squares). A
  // training step is allowed one (tests/train/test_step_syncs.cpp); the host backends never wait,
  // and the counting backend counts what a device backend would do.
  virtual int64_t host_waits() const { return 0; }
  // Points in the backend's stream of work, for a profile that must not wait after every op:
  // timing_mark() records one and returns its id; marks_elapsed_ms(from, to) is the time
  // between two marks, waiting for the later one; reset_marks() forgets them all. A device
  // backend records events on its stream; a host backend's ops finish before they return, so
  // its marks are wall-clock instants.
  virtual int64_t timing_mark() {
    host_marks_.push_back(std::chrono::steady_clock::now());
    return int64_t(host_marks_.size()) - 1;
  }
  virtual double marks_elapsed_ms(int64_t from, int64_t to) {
    return std::chrono::duration<double, std::milli>(host_marks_.at(size_t(to)) -
                                                     host_marks_.at(size_t(from)))
        .count();
  }
  virtual void reset_marks() { host_marks_.clear(); }
  // Bytes of the backend's device memory free now; 0 for the host backends, whose memory is
  // the machine's (train/memory_plan.h reads that).
  virtual size_t device_memory_free() { return 0; }
  // `bytes` of zeroed memory aligned to kAllocationAlignment; fails naming `what` and the size.
  virtual void* allocate(size_t bytes, const char* what) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
  // Host staging: dst/src are host memory of src.nbytes() / dst.nbytes() bytes.
  void to_host(void* dst, Tensor src);
  void from_host(Tensor dst, const void* src);
  // dst = src, element for element (same element count, shapes may differ; the two must not
  // overlap). Between f32 and bf16 it converts, rounding to nearest even, and between f32 and
  // f64 (device scalars) exactly or rounding to nearest.
  void copy(Tensor dst, Tensor src);
  // dst[:, dst_col : dst_col + cols] = src[:, src_col : src_col + cols] for every row:
  // a strided slice out of, or into, a row-major matrix (dst.rows() == src.rows()).
  void copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col, int64_t cols);
  // The index of the first id outside [lo, hi) in an i32 tensor, or -1.
  int64_t first_outside(Tensor ids, int64_t lo, int64_t hi);

  void gemm(const GemmArgs& args);

  // out[n,:] = table[tokens[n],:]; tokens i32 [N], table [V,C], out [N,C].
  void embedding_forward(Tensor out, Tensor tokens, Tensor table);
  // dtable[tokens[n],:] += dout[n,:].
  void embedding_backward(Tensor dtable, Tensor tokens, Tensor dout);

  // out = x * rstd * weight, rstd[n] = 1/sqrt(mean(x[n,:]^2) + eps); x,out [N,C], rstd [N].
  void rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps);
  // dx += ∂/∂x (the residual stream's gradient has another producer); dweight +=.
  void rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                        Tensor rstd);
  // The residual add and the next RMSNorm in one pass: sum = x + residual, then out =
  // RMSNorm(sum) · weight and rstd as rmsnorm_forward gives them, computed from the fp32 sum
  // before it is rounded to sum's dtype (in bf16 the fused op rounds once where add then
  // rmsnorm_forward round twice). sum must not alias x or residual.
  void residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x, Tensor residual,
                                Tensor weight, float eps);

  // out = (x - mean) * rstd * weight + bias over the last dim; mean, rstd [N].
  void layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight, Tensor bias,
                         float eps);
  // dx written; dweight, dbias +=.
  void layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                          Tensor weight, Tensor mean, Tensor rstd);

  // In-place rotary embedding (HF rotate-half) of q [B,S,H,hd] and k [B,S,Hkv,hd] together
  // (one pass, one launch); position = index in S. Backward rotates their gradients back in
  // place (the rotation is orthogonal). Overwrites, it does not add: RoPE is applied to
  // buffers the caller owns.
  void rope_forward(Tensor q, Tensor k, float theta);
  void rope_backward(Tensor dq, Tensor dk, float theta);

  // Causal attention with GQA. q [B,S,H,hd], k,v [B,S,Hkv,hd], out [B,S,H,hd];
  // lse [B,H,S] = log Σ_j exp(score_ij), the softmax statistic kept for backward, which
  // recomputes the probabilities from it (no [S,S] matrix is stored).
  // score_ij = q_i·k_j / sqrt(hd) for j <= i. Query head h reads kv head h / (H / Hkv).
  void attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v);
  // dq, dk, dv written (before RoPE's backward, which the caller runs on dq and dk).
  void attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                          Tensor q, Tensor k, Tensor v);
  // Which attention kernels run for q [batch, seq, heads, head_dim], k, v with kv_heads heads,
  // in `dtype`, and why: the line a run prints first ("cuDNN 9.19.0 SDPA (...)", "own kernels
  // (cuDNN not loadable: ...)"). A device backend prepares them here, so that slow one-time
  // work (cuDNN building its graphs) happens before the first step; the host backends have one.
  virtual std::string attention_path(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, DType dtype) {
    return "own CPU kernel";
  }
  // Device workspace the same attention takes beyond the activations (cuDNN's backward: its
  // dP or dQ workspace, core/attention_workspace.h), for the memory plan; 0 for the host
  // backends, whose attention needs none.
  virtual int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads,
                                            int64_t kv_heads, int64_t head_dim, DType dtype) {
    return 0;
  }

  // out = silu(x) = x * sigmoid(x).
  void silu_forward(Tensor out, Tensor x);
  // dx = dout · silu'(x) (written).
  void silu_backward(Tensor dx, Tensor dout, Tensor x);

  // out = act(gate) * up, act = silu when gate_act, identity otherwise.
  void swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act);
  // dgate = dout · up · act'(gate), dup = dout · act(gate) (both written).
  void swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                       bool gate_act);

  // out = a + b (out may alias a or b).
  void add(Tensor out, Tensor a, Tensor b);
  // dst += src.
  void accumulate(Tensor dst, Tensor src);
  void fill_zero(Tensor x);
  void scale(Tensor x, float factor);
  // Scalar reductions, accumulated in double in a fixed order (the same bits whatever the
  // thread count: losses, gradient norms and non-finite checks decide clipping and skips).
  double sum_squares(Tensor x);
  double sum(Tensor x);
  // --- Device scalars: a step's loss, gradient norm and clip factor are computed where the
  // gradients live, as f64 [k] tensors (one element each), so that the host reads them once,
  // when the step ends, instead of waiting for the device at every reduction.
  // out[s] = Σ over the ranges with slot s, in their order, of sum_squares(x[range]); out f64,
  // x one flat f32/bf16 buffer. Slots without a range become 0.
  void sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges);
  // acc[0] += the mean of x, rounded to fp32 first (a micro-batch's loss as bottle has always
  // reported it); acc f64 [1].
  void accumulate_mean(Tensor acc, Tensor x);
  // In double, on one-element f64 tensors: out = a + b, out = a / divisor, out = sqrt(a).
  void scalar_add(Tensor out, Tensor a, Tensor b);
  void scalar_divide(Tensor out, Tensor a, double divisor);
  void scalar_sqrt(Tensor out, Tensor a);
  // control (f32 [kStepControlSize]) from the step's loss and gradient norm (f64 [1] each):
  // apply = 1 when both are finite, else 0; scale = max_norm / (norm + 1e-6) when max_norm > 0
  // and norm > max_norm, else 1 (train_step.h's clip_factor, on the device).
  void clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm);

  // out = a ⊙ b and out = a / b, elementwise (out may alias a or b).
  void multiply(Tensor out, Tensor a, Tensor b);
  void divide(Tensor out, Tensor a, Tensor b);
  // out[n] = sqrt(sumsq[n] / count + eps), or 1 / sqrt(...) when `reciprocal`: a row's RMS
  // (or RMSNorm's rstd) from its sum of squares.
  void rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps, bool reciprocal);

  // losses[n] = logsumexp(logits[n,:]) - logits[n, targets[n]]; probs [N,V] = softmax(logits).
  void cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits, Tensor targets);
  // dlogits = scale * (probs - onehot(targets)) (written).
  void cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets, float scale);

  // --- Tensor-parallel kernels: a rank holds a slice of the vocabulary or of the hidden dim.
  // The table holds rows [first, first + table.rows()) of the whole vocabulary: tokens outside
  // it give zero rows (forward) and are skipped (backward). Tokens must be >= 0.
  void embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first);
  void embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout, int64_t first);
  // max[n] = max_j logits[n,j]; sumexp[n] = Σ_j exp(logits[n,j] - max[n]).
  void logits_row_stats(Tensor max, Tensor sumexp, Tensor logits);
  // The logits hold vocabulary columns [first, first + cols) and max, sumexp are the
  // whole-vocabulary statistics: dlogits[n,j] = scale * (exp(logits[n,j] - max[n]) /
  // sumexp[n] - [first + j == targets[n]]) (written).
  void cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                    Tensor targets, int64_t first, float scale);
  // Online RMSNorm on a slice of C of each row's columns: sumsq[n] = Σ_j x[n,j]^2 and
  // out = x * weight / sqrt(sumsq / C + eps), normalised by the slice's own statistic.
  void rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight, float eps);
  // RMSNorm backward on a slice of the d columns, given the whole-row rstd [N] and
  // dot[n] = Σ over all d columns of weight * dout * x:
  // dx += rstd * weight * dout - x * rstd^3 * dot / d;  dweight += Σ_n dout * x * rstd.
  void rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                              Tensor rstd, Tensor dot, int64_t d);
  // Vocabulary-parallel cross-entropy, per row n, on a rank holding logit columns
  // [first, first + cols): after the max's all-reduce, this rank's share of the whole-row
  // statistics, sumexp[n] = local_sumexp[n] · exp(local_max[n] - max[n]) and target_logit[n]
  // = logits[n, targets[n] - first] where this rank holds it, else 0 (sumexp may alias
  // local_max). After their all-reduce: losses[n] = log(sumexp[n]) + max[n] - target_logit[n].
  void cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                    Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                    int64_t first);
  void cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit, Tensor max);
  // out[n,:] = x[n,:] * factor[n] (out may alias x).
  void scale_rows(Tensor out, Tensor x, Tensor factor);
  // out[n] = Σ_j a[n,j] * b[n,j].
  void row_dot(Tensor out, Tensor a, Tensor b);

  // Decoupled-weight-decay Adam on one contiguous fp32 buffer in one pass; m, v are the
  // moments. compute, when not empty, receives the updated values in its own dtype (the bf16
  // copy the GEMMs read) in the same pass. control, when not empty, is a step's control tensor
  // (clip_and_check): the gradient is scaled by control[kControlScale] and nothing is written
  // when control[kControlApply] is 0; when empty, args.grad_scale scales and the update
  // always applies.
  void adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v, Tensor control,
                    const AdamWArgs& args);

 protected:
  // The implementations, called once the public op has checked its operands (backend.cpp):
  // shapes, dtypes, that every tensor lives where this backend computes. An implementation
  // checks only what is its own (a dtype it lacks, a limit of its kernels).
  virtual void do_to_host(void* dst, Tensor src) = 0;
  virtual void do_from_host(Tensor dst, const void* src) = 0;
  virtual void do_copy(Tensor dst, Tensor src) = 0;
  virtual void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                               int64_t cols) = 0;
  virtual int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) = 0;
  virtual void do_gemm(const GemmArgs& args) = 0;
  virtual void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) = 0;
  virtual void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) = 0;
  virtual void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) = 0;
  virtual void do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x,
                                           Tensor residual, Tensor weight, float eps) = 0;
  virtual void do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                                   Tensor rstd) = 0;
  virtual void do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                                    Tensor bias, float eps) = 0;
  virtual void do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                                     Tensor weight, Tensor mean, Tensor rstd) = 0;
  virtual void do_rope_forward(Tensor q, Tensor k, float theta) = 0;
  virtual void do_rope_backward(Tensor dq, Tensor dk, float theta) = 0;
  virtual void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) = 0;
  virtual void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                                     Tensor lse, Tensor q, Tensor k, Tensor v) = 0;
  virtual void do_silu_forward(Tensor out, Tensor x) = 0;
  virtual void do_silu_backward(Tensor dx, Tensor dout, Tensor x) = 0;
  virtual void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) = 0;
  virtual void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                                  bool gate_act) = 0;
  virtual void do_add(Tensor out, Tensor a, Tensor b) = 0;
  virtual void do_accumulate(Tensor dst, Tensor src) = 0;
  virtual void do_fill_zero(Tensor x) = 0;
  virtual void do_scale(Tensor x, float factor) = 0;
  virtual double do_sum_squares(Tensor x) = 0;
  virtual double do_sum(Tensor x) = 0;
  virtual void do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) = 0;
  virtual void do_accumulate_mean(Tensor acc, Tensor x) = 0;
  virtual void do_scalar_add(Tensor out, Tensor a, Tensor b) = 0;
  virtual void do_scalar_divide(Tensor out, Tensor a, double divisor) = 0;
  virtual void do_scalar_sqrt(Tensor out, Tensor a) = 0;
  virtual void do_clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) = 0;
  virtual void do_multiply(Tensor out, Tensor a, Tensor b) = 0;
  virtual void do_divide(Tensor out, Tensor a, Tensor b) = 0;
  virtual void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                                       bool reciprocal) = 0;
  virtual void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                        Tensor targets) = 0;
  virtual void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                         float scale) = 0;
  virtual void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table,
                                          int64_t first) = 0;
  virtual void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                           int64_t first) = 0;
  virtual void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) = 0;
  virtual void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                               Tensor sumexp, Tensor targets, int64_t first,
                                               float scale) = 0;
  virtual void do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                        float eps) = 0;
  virtual void do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x,
                                         Tensor weight, Tensor rstd, Tensor dot, int64_t d) = 0;
  virtual void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                               Tensor local_sumexp, Tensor local_max, Tensor max,
                                               Tensor logits, Tensor targets, int64_t first) = 0;
  virtual void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                             Tensor max) = 0;
  virtual void do_scale_rows(Tensor out, Tensor x, Tensor factor) = 0;
  virtual void do_row_dot(Tensor out, Tensor a, Tensor b) = 0;
  virtual void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                               Tensor control, const AdamWArgs& args) = 0;

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // timing_mark's, host backends
};

// "cpu", "reference" or "cuda" (when compiled in and a GPU is visible). cpu's kernels take bf16
// tensors themselves; the reference comes wrapped to take them (core/widening_backend.h), and
// so does "cpu-widened", the cpu kernels behind that wrapper: a fallback to name, and the bits
// the native bf16 kernels are tested against.
std::unique_ptr<Backend> make_backend(std::string_view name);
// Why make_backend(name) would fail on this machine ("no CUDA device is visible", "this build
// has no CUDA backend ..."), or empty when it would not: GPU tests skip with this reason.
std::string backend_unavailable(std::string_view name);
// The process's host-memory backend ("cpu"): arenas that are not given a backend (host
// workspaces, tests, tools) allocate from it. A device run passes its backend explicitly.
Backend& host_backend();
// The backends compiled in, one line each with the library behind it, e.g.
// "cpu: oneDNN 2.6.3 GEMMs + OpenMP" (for `bottle --version`).
std::vector<std::string> backend_names();

}  // namespace bottle
