#pragma once
// What the cpu backend's kernels (src/backend/cpu/*.cpp) share: the vectorised exp, the loops
// that split work across OpenMP threads, scratch memory, and the fp32 windows through which
// every kernel reads and writes bf16 tensors.
//
// bf16: each kernel's loops compute in fp32, as they do for fp32 tensors. A bf16 operand is
// seen through a Window: the stretch a thread works on (a row, a tile of an elementwise op,
// a block of attention) is widened into that thread's slab, at most a few rows that stay in
// L1/L2, and an output stretch is rounded back once, when the thread is done with it. No
// kernel makes an fp32 copy of a whole tensor, and each stores exactly what the fp32 kernel
// run on the widened tensor and rounded afterwards stores (what the widening backend, the
// reference's bf16 path, computes): same fp32 operations in the same order, one rounding.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "core/arena.h"
#include "core/bf16.h"
#include "core/bf16_convert.h"
#include "core/kernel_math.h"
#include "core/tensor.h"

namespace bottle::cpu {

// exp that the compiler vectorizes (glibc's expf is scalar unless -ffast-math): 2^t with
// t = x·log2(e) split into an integer n (the exponent bits) and f in [-1/2, 1/2], 2^f by
// its degree-7 Taylor polynomial. Relative error below 2e-7 over the clamped range.
// ±inf give the clamp's values (e^88, e^-87); NaN gives NaN, never an integer conversion of
// NaN, which is undefined (a diverging run feeds NaN here).
inline float fast_exp(float x) {
  // Written so that NaN fails both comparisons and lands on a finite value for the integer
  // part; the final select puts the NaN back. Both compile to vector blends.
  const float xc = x > -87.0f ? (x < 88.0f ? x : 88.0f) : -87.0f;
  const float t = xc * 1.44269504088896341f;
  // Rounds to nearest by truncating a positive value: std::floor does not vectorize under
  // GCC's default -ftrapping-math. t >= -125.6 after the clamp.
  const float n = float(int32_t(t + 128.5f) - 128);
  const float f = (t - n) * 0.693147180559945f;  // 2^(t-n) = e^f, |f| <= ln2/2
  float p = 1.0f / 5040.0f;
  p = p * f + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (int32_t(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return x == x ? p * scale : x;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// out[0, n) = softmax(x[0, n)) (out may alias x); returns the row's max and Σ exp(x - max).
inline kmath::SoftmaxState softmax_in_place(float* out, const float* x, int64_t n) {
  float mx = x[0];
#pragma omp simd reduction(max : mx)
  for (int64_t j = 1; j < n; ++j) mx = std::max(mx, x[j]);
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    out[j] = fast_exp(x[j] - mx);
    sum += out[j];
  }
  const float inv = 1.0f / sum;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] *= inv;
  return {mx, sum};
}

// log Σ exp(x) of a row from its softmax statistics.
inline float log_sum_exp(const kmath::SoftmaxState& s) { return s.max + std::log(s.sumexp); }

// Runs body(j, j == target) for j in [0, n): the target's element between two loops that
// compare nothing, so that both vectorise (a comparison with the target inside the loop keeps
// GCC from vectorising it), and each element is done in order, while its row is in cache.
// A target outside [0, n) leaves every element a non-target one.
template <typename Body>
inline void for_row_with_target(int64_t n, int64_t target, Body body) {
  const int64_t split = target >= 0 && target < n ? target : n;
#pragma omp simd
  for (int64_t j = 0; j < split; ++j) body(j, false);
  if (split < n) body(split, true);
#pragma omp simd
  for (int64_t j = split + 1; j < n; ++j) body(j, false);
}

// Scratch memory that only grows; accounted as workspace.
class Workspace {
 public:
  Workspace() = default;
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { MemoryStats::global().sub(MemoryTag::workspace, buf_.size() * sizeof(float)); }
  float* get(size_t n) {
    if (n > buf_.size()) {
      MemoryStats::global().sub(MemoryTag::workspace, buf_.size() * sizeof(float));
      buf_.assign(n, 0.0f);
      MemoryStats::global().add(MemoryTag::workspace, n * sizeof(float));
    }
    return buf_.data();
  }
  // Gives the buffer back; the next get() allocates afresh.
  void release() {
    MemoryStats::global().sub(MemoryTag::workspace, buf_.size() * sizeof(float));
    std::vector<float>().swap(buf_);
  }

 private:
  std::vector<float> buf_;
};

inline bool any_bf16(std::initializer_list<Tensor> ts) {
  for (const Tensor& t : ts)
    if (t.dtype == DType::bf16) return true;
  return false;
}

// The floats of `count` slabs of `len` floats for each OpenMP thread: what Slabs takes, and
// what the memory plan counts for them (CpuBackend::kernel_scratch_bytes).
inline size_t slab_floats(int count, int64_t len) {
  return size_t(omp_get_max_threads()) * size_t(count) * size_t(len);
}

// `count` slabs of `len` floats for each OpenMP thread, carved out of one workspace before a
// parallel region (none at all when no operand is bf16); get(k) is the calling thread's k-th.
class Slabs {
 public:
  Slabs(Workspace& ws, int count, int64_t len, bool needed)
      : count_(count), len_(needed ? len : 0), base_(ws.get(slab_floats(count, len_))) {}
  float* get(int k) const {
    return base_ + (size_t(omp_get_thread_num()) * size_t(count_) + size_t(k)) * size_t(len_);
  }

 private:
  int count_;
  int64_t len_;
  float* base_;
};

enum class Access { read, write, read_write };

// One thread's fp32 view of a float tensor, one stretch at a time: an f32 tensor's own
// memory; for a bf16 tensor, the stretch widened into the thread's slab (unless only
// written) and rounded back into the tensor when the next stretch is asked for or the window
// closes (unless only read). An empty tensor (an optional operand) gives null.
class Window {
 public:
  Window(Tensor t, Access access, float* slab) : t_(t), access_(access), slab_(slab) {}
  Window(const Window&) = delete;
  Window& operator=(const Window&) = delete;
  ~Window() { flush(); }

  float* at(int64_t offset, int64_t len) {
    if (t_.empty()) return nullptr;
    if (t_.dtype != DType::bf16) return t_.f32() + offset;
    flush();
    offset_ = offset;
    len_ = len;
    if (access_ != Access::write) widen_bf16(slab_, t_.bf16() + offset, len);
    return slab_;
  }
  // Rounds the stretch in the slab back into the tensor now (at() and closing do it too).
  void flush() {
    if (len_ > 0 && access_ != Access::read) narrow_bf16(t_.bf16() + offset_, slab_, len_);
    len_ = 0;
  }

 private:
  Tensor t_;
  Access access_;
  float* slab_;
  int64_t offset_ = 0, len_ = 0;
};

// Element i of a float tensor, and its store (rounded for bf16): per-row statistics.
inline float load(const Tensor& t, int64_t i) {
  return t.dtype == DType::bf16 ? bf16_to_float(t.bf16()[i]) : t.f32()[i];
}
inline void store(const Tensor& t, int64_t i, float v) {
  if (t.dtype == DType::bf16)
    t.bf16()[i] = bf16_from_float(v);
  else
    t.f32()[i] = v;
}

// A small operand read whole by every row (a norm's weight [C]) as an f32 tensor: itself, or
// widened once per call into `ws`. The loops read it as `w.f32()[j]`, as they did before they
// took bf16: through a plain pointer GCC vectorises them otherwise and sums in another order.
inline Tensor widened(const Tensor& t, Workspace& ws) {
  if (t.dtype != DType::bf16) return t;
  float* w = ws.get(size_t(t.numel()));  // [numel]
  widen_bf16(w, t.bf16(), t.numel());
  return Tensor{w, t.shape, DType::f32, t.device};
}

// An operand of an elementwise op and how the op uses it.
struct Operand {
  Tensor t;
  Access access;
};
inline Operand in(Tensor t) { return {t, Access::read}; }
inline Operand out(Tensor t) { return {t, Access::write}; }
inline Operand inout(Tensor t) { return {t, Access::read_write}; }

// An elementwise op's tile in bf16: each operand's window, a slab per thread, whatever n is.
inline constexpr int64_t kElementwiseTile = 2048;
// The most operands an elementwise op has (swiglu_backward's dgate, dup, dout, gate, up): the
// memory plan's slabs for them are this many tiles.
inline constexpr size_t kMaxElementwiseOperands = 5;

// An elementwise op over n elements: each thread takes one contiguous range, and body(len, p)
// runs the op's fp32 loop over len elements, p[k] being operand k's fp32 window onto them:
// the whole range when every operand is f32, else tiles of kElementwiseTile elements that stay
// in L1.
template <size_t N, typename Body>
void elementwise(Workspace& ws, int64_t n, const std::array<Operand, N>& ops, Body body) {
  static_assert(N <= kMaxElementwiseOperands,
                "the memory plan counts kMaxElementwiseOperands tiles per thread: raise it");
  constexpr int64_t kTile = kElementwiseTile;
  bool bf16 = false;
  for (const Operand& o : ops) bf16 = bf16 || o.t.dtype == DType::bf16;
  const Slabs slabs(ws, int(N), kTile, bf16);
#pragma omp parallel
  {
    const int64_t nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = n * t / nt, end = n * (t + 1) / nt;
    const int64_t tile = bf16 ? kTile : std::max<int64_t>(end - begin, 1);
    std::array<float*, N> p{};
    for (int64_t i = begin; i < end; i += tile) {
      const int64_t len = std::min(tile, end - i);
      for (size_t k = 0; k < N; ++k) {
        const Tensor& x = ops[k].t;
        if (x.dtype != DType::bf16) {
          p[k] = x.f32() + i;
          continue;
        }
        p[k] = slabs.get(int(k));
        if (ops[k].access != Access::write) widen_bf16(p[k], x.bf16() + i, len);
      }
      body(len, p);
      for (size_t k = 0; k < N; ++k)
        if (ops[k].access != Access::read && ops[k].t.dtype == DType::bf16)
          narrow_bf16(ops[k].t.bf16() + i, p[k], len);
    }
  }
}

}  // namespace bottle::cpu
