#pragma once
// The CUDA kernels' launchers: plain pointers, element counts and a stream. The .cu files
// that define them (one per op family, as in llm.c) are compiled by nvcc; the backend that
// calls them (cuda_backend.cpp) by the host compiler, which checks shapes and dtypes first,
// so a launcher trusts its arguments. Every launcher only enqueues work on `stream`; errors
// surface at the backend's next check (cudaGetLastError after each launch).
//
// Element types: an Array is a device pointer with its dtype, f32 or bf16; kernels load
// every element as fp32, compute in fp32 and round once on store (core/kernel_math.h), so
// one kernel serves every mix of fp32 statistics, bf16 activations and fp32 gradients.
// Token ids and targets are int32. Row-major throughout: rows × cols.
//
// Determinism: no floating-point atomics. Every reduction (a parameter gradient over the
// rows, a sum over a tensor) sums in an order fixed by the shape alone, so that a run repeats
// bit for bit on the same GPU (resume is exact).
#include <cuda_runtime.h>

#include <cstdint>

#include "core/dtype.h"

namespace bottle::cuda {

struct Array {
  void* data = nullptr;
  DType dtype = DType::f32;
};
struct ConstArray {
  const void* data = nullptr;
  DType dtype = DType::f32;
  // constexpr, so that device code (nvcc --expt-relaxed-constexpr) converts too.
  constexpr ConstArray() = default;
  constexpr ConstArray(const void* d, DType t) : data(d), dtype(t) {}
  constexpr ConstArray(Array a) : data(a.data), dtype(a.dtype) {}  // NOLINT: an output read back
};

// --- Conversions and indices (elementwise.cu).
// dst[i] = src[i], converting between f32 and bf16 (round to nearest even); n elements.
void convert(cudaStream_t stream, Array dst, ConstArray src, int64_t n);
// dst[r, dst_col + j] = src[r, src_col + j] for j < cols, converting dtypes (same-dtype
// slices are cudaMemcpy2D in the backend).
void convert_columns(cudaStream_t stream, Array dst, int64_t dst_cols, int64_t dst_col,
                     ConstArray src, int64_t src_cols, int64_t src_col, int64_t rows, int64_t cols);
// *result = min(*result, the smallest i with ids[i] outside [lo, hi)): the caller sets
// *result = n first, so n means there is none. `result` is device memory.
void first_outside(cudaStream_t stream, const int32_t* ids, int64_t n, int64_t lo, int64_t hi,
                   unsigned long long* result);

// --- Elementwise (elementwise.cu). out may alias an input.
void add(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n);
void accumulate(cudaStream_t stream, Array dst, ConstArray src, int64_t n);  // dst += src
void scale(cudaStream_t stream, Array x, float factor, int64_t n);
void multiply(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n);
void divide(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t n);
// out[i] = sqrt(sumsq[i] / count + eps) (or its reciprocal).
void rms_from_sum_squares(cudaStream_t stream, Array out, ConstArray sumsq, int64_t n, float count,
                          float eps, bool reciprocal);
// out[r, :] = x[r, :] * factor[r].
void scale_rows(cudaStream_t stream, Array out, ConstArray x, ConstArray factor, int64_t rows,
                int64_t cols);
// out[r] = Σ_j a[r, j] b[r, j] (fp32 accumulation).
void row_dot(cudaStream_t stream, Array out, ConstArray a, ConstArray b, int64_t rows,
             int64_t cols);
void silu_forward(cudaStream_t stream, Array out, ConstArray x, int64_t n);
void silu_backward(cudaStream_t stream, Array dx, ConstArray dout, ConstArray x, int64_t n);
void swiglu_forward(cudaStream_t stream, Array out, ConstArray gate, ConstArray up, int64_t n,
                    bool gate_act);
void swiglu_backward(cudaStream_t stream, Array dgate, Array dup, ConstArray dout, ConstArray gate,
                     ConstArray up, int64_t n, bool gate_act);

// --- Reductions to one scalar (reduce.cu): Σ x[i] or Σ x[i]², accumulated in double in an
// order fixed by n. `partials` is device scratch of reduce_partials_count() doubles;
// `result` one device double.
int reduce_partials_count();
// The most slots sum_squares_ranges sums at once.
int reduce_max_slots();
void reduce_sum(cudaStream_t stream, ConstArray x, int64_t n, bool squares, double* partials,
                double* result);

// --- Embedding (embedding.cu). The table holds vocabulary rows [first, first + table_rows);
// a token outside it gives a zero row (forward) and is skipped (backward).
void embedding_forward(cudaStream_t stream, Array out, const int32_t* tokens, int64_t n,
                       ConstArray table, int64_t table_rows, int64_t cols, int64_t first);
// dtable[tokens[i] - first, :] += dout[i, :], summed over i in order (deterministic).
void embedding_backward(cudaStream_t stream, Array dtable, const int32_t* tokens, int64_t n,
                        ConstArray dout, int64_t table_rows, int64_t cols, int64_t first);

// --- Rotary embedding (rope.cu), in place on q [B, S, q_heads, hd] and k [B, S, k_heads, hd]
// in one launch, from `table` [2, seq, hd/2] (the cos, then the sin, of every position and
// pair, on the device); direction -1 undoes it.
void rope(cudaStream_t stream, Array q, Array k, const float* table, int64_t batch, int64_t seq,
          int64_t q_heads, int64_t k_heads, int64_t hd, float direction);

// --- Norms (norm.cu). Statistics arrays (rstd, mean, sumsq, dot) are per row.
// out = x * rstd * w; rstd[r] = 1/sqrt(mean_j x² + eps). `rstd` and `sumsq` may each be
// null; when sumsq is given it receives Σ_j x², the online-RMSNorm shard statistic.
void rmsnorm_forward(cudaStream_t stream, Array out, Array rstd, Array sumsq, ConstArray x,
                     ConstArray weight, int64_t rows, int64_t cols, float eps);
// sum = x + residual; out = sum rstd w with rstd from the fp32 sum (Backend's fused op). sum
// aliases neither input.
void residual_rmsnorm_forward(cudaStream_t stream, Array sum, Array out, Array rstd, ConstArray x,
                              ConstArray residual, ConstArray weight, int64_t rows, int64_t cols,
                              float eps);
// The norms' backward kernels sum their parameter gradients over row chunks, whose partial sums
// wait in `scratch`: device memory of norm_backward_scratch_bytes(rows, cols) bytes (null when
// that is 0).
size_t norm_backward_scratch_bytes(int64_t rows, int64_t cols);
// dx += rstd w dout - x rstd³ dot / d, with dot[r] = Σ_j w dout x over the whole row of d
// columns (for a plain RMSNorm the caller passes dot = null: it is computed here over the
// cols, and d = cols); dweight += Σ_r dout x rstd.
void rmsnorm_backward(cudaStream_t stream, Array dx, Array dweight, ConstArray dout, ConstArray x,
                      ConstArray weight, ConstArray rstd, ConstArray dot, int64_t rows,
                      int64_t cols, int64_t d, float* scratch);
void layernorm_forward(cudaStream_t stream, Array out, Array mean, Array rstd, ConstArray x,
                       ConstArray weight, ConstArray bias, int64_t rows, int64_t cols, float eps);
void layernorm_backward(cudaStream_t stream, Array dx, Array dweight, Array dbias, ConstArray dout,
                        ConstArray x, ConstArray weight, ConstArray mean, ConstArray rstd,
                        int64_t rows, int64_t cols, float* scratch);

// --- Attention (attention.cu): causal, GQA, FlashAttention-2 tiling with an online softmax;
// only the log-sum-exp lse [B, H, S] (f32) is kept. q, out [B, S, H, hd]; k, v [B, S, Hkv, hd].
// hd <= 256.
void attention_forward(cudaStream_t stream, Array out, Array lse, ConstArray q, ConstArray k,
                       ConstArray v, int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                       int64_t hd);
// dq, dk, dv = the gradients, written: each is an input gradient with one producer (backend.h).
// `scratch` is device memory of attention_backward_scratch_bytes(...) bytes.
size_t attention_backward_scratch_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                        int64_t hd);
void attention_backward(cudaStream_t stream, Array dq, Array dk, Array dv, ConstArray dout,
                        ConstArray out, ConstArray lse, ConstArray q, ConstArray k, ConstArray v,
                        int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t hd,
                        void* scratch);

// --- Cross-entropy (cross_entropy.cu), rows × v logits. Never materialises an fp32 copy of
// the logits: each row is read in its own dtype.
// losses[r] = logsumexp(logits[r, :]) - logits[r, targets[r]]; probs = softmax(logits).
void cross_entropy_forward(cudaStream_t stream, Array losses, Array probs, ConstArray logits,
                           const int32_t* targets, int64_t rows, int64_t v);
// dlogits = scale (probs - onehot(targets)), written.
void cross_entropy_backward(cudaStream_t stream, Array dlogits, ConstArray probs,
                            const int32_t* targets, int64_t rows, int64_t v, float scale);
// max[r] = max_j logits[r, j]; sumexp[r] = Σ_j exp(logits[r, j] - max[r]).
void logits_row_stats(cudaStream_t stream, Array max, Array sumexp, ConstArray logits, int64_t rows,
                      int64_t v);
// dlogits[r, j] = scale (exp(logits[r, j] - max[r]) / sumexp[r] - [first + j == targets[r]]),
// written.
void cross_entropy_shard_backward(cudaStream_t stream, Array dlogits, ConstArray logits,
                                  ConstArray max, ConstArray sumexp, const int32_t* targets,
                                  int64_t rows, int64_t v, int64_t first, float scale);
// sumexp[r] = local_sumexp[r] exp(local_max[r] - max[r]) (sumexp may alias local_max);
// target_logit[r] = logits[r, targets[r] - first] when this shard holds it, else 0.
void cross_entropy_shard_partials(cudaStream_t stream, Array sumexp, Array target_logit,
                                  ConstArray local_sumexp, ConstArray local_max, ConstArray max,
                                  ConstArray logits, const int32_t* targets, int64_t rows,
                                  int64_t v, int64_t first);
// losses[r] = log(sumexp[r]) + max[r] - target_logit[r].
void cross_entropy_shard_losses(cudaStream_t stream, Array losses, ConstArray sumexp,
                                ConstArray target_logit, ConstArray max, int64_t rows);

// --- AdamW (optimizer.cu) on fp32 masters, gradients and moments, in one pass over the flat
// buffers: 4 elements per thread with 128-bit loads where the buffers allow it.
struct AdamWParams {
  float lr, beta1, beta2, eps, weight_decay, grad_scale;
  int64_t step;
  // Every no-decay range starts and ends at a multiple of 4 elements (the parameter store's
  // alignment), so that groups of 4 share their decay and take the 128-bit path.
  bool gaps_on_groups = true;
};
// A no-decay range [begin, end) of the buffer, in elements.
struct DecayGap {
  int64_t begin, end;
};
// param, grad, m, v: [n] fp32. compute (data may be null): [n] f32 or bf16, written with the
// updated values. control (may be null): f32 [2] = {grad scale, apply}, read on the device;
// null uses args.grad_scale. gaps: device array of `gap_count` ascending no-decay ranges.
void adamw_update(cudaStream_t stream, float* param, Array compute, const float* grad, float* m,
                  float* v, int64_t n, const float* control, const DecayGap* gaps,
                  int64_t gap_count, const AdamWParams& args);

// --- Muon's element-wise parts (optimizer.cu), kernel_math.h's steps. control (may be null):
// as adamw_update's. update, buffer, grad: [n] fp32.
void muon_momentum(cudaStream_t stream, float* update, float* buffer, const float* grad, int64_t n,
                   const float* control, float momentum, float grad_scale, bool nesterov);
// x [n] *= 1 / max(sqrt(sumsq[0]), 1e-7), sumsq f32 [1] on the device.
void muon_normalize(cudaStream_t stream, float* x, int64_t n, const float* sumsq);
// param [n] ← param · decay − step · update [n]; compute as adamw_update's.
void muon_apply(cudaStream_t stream, float* param, Array compute, const float* update, int64_t n,
                const float* control, float decay, float step);

// --- Device scalars (reduce.cu), f64.
// One range of a flat buffer whose squares go to out[slot].
struct SlotRange {
  int64_t offset, count;
  int32_t slot;
};
// out[s] = Σ over ranges of slot s of Σ x[i]² (each slot in double, in an order fixed by the
// ranges alone); ranges: device array of `range_count`; out: `slots` doubles; partials:
// reduce_partials_count() * slots doubles of scratch. One launch covers every range.
void sum_squares_ranges(cudaStream_t stream, double* out, int slots, ConstArray x,
                        const SlotRange* ranges, int64_t range_count, double* partials);
// *acc += (double)(float)(Σ x / n), the sum as reduce_sum computes it; `sum` is one double of
// scratch.
void accumulate_mean(cudaStream_t stream, double* acc, ConstArray x, int64_t n, double* partials,
                     double* sum);
enum class ScalarOp : uint8_t { add, divide, sqrt };
// *out = *a + *b, *a / divisor, sqrt(*a): one thread.
void scalar_op(cudaStream_t stream, double* out, const double* a, const double* b, double divisor,
               ScalarOp op);
// control[0] = clip scale, control[1] = apply (Backend::clip_and_check).
void clip_and_check(cudaStream_t stream, float* control, const double* loss, const double* norm,
                    double max_norm);
// dst[i] = src[i] between f64 and f32 (device scalars); n elements.
void convert_scalars(cudaStream_t stream, void* dst, DType dst_dtype, const void* src,
                     DType src_dtype, int64_t n);

}  // namespace bottle::cuda
