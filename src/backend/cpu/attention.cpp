// Causal GQA attention, flash-attention style: each (batch, head) walks its queries in blocks
// of kQueryBlock rows; a block's scores (at most kQueryBlock x S) stay in a per-thread
// buffer, so no [S, S] matrix ever reaches memory. Causality bounds each block's keys.
// Backward recomputes the probabilities from the saved log-sum-exp. Work items run in
// parallel, each GEMM single-threaded inside them (oneDNN runs serially inside a parallel
// region).
//
// bf16 q, k, v, out and their gradients are widened per work item (a kv head's K and V, and
// its dK, dV) and per query block (Q, O, dO, dQ rows), into compact per-thread slabs, and the
// outputs rounded back once when the item or block is done; the GEMMs and the softmax run in
// fp32 as for fp32 tensors. Scores and the log-sum-exp stay fp32 (§18).
#include <dnnl.h>

#include <cstring>

#include "backend/cpu/cpu_backend.h"
#include "backend/dnnl_gemm.h"

namespace bottle::cpu {
namespace {

// Row-major single-threaded-when-nested GEMM: C = alpha op(A) op(B) + beta C.
inline void sgemm(char ta, char tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  dnnl_sgemm(ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

// `rows` rows of `cols` floats with row stride `ld`, as fp32: an f32 tensor's own memory, or
// for a bf16 tensor a compact copy (row stride cols) in `slab`, widened when `read`.
struct Block {
  float* p;
  int64_t ld;
};

Block open_block(const Tensor& t, int64_t offset, int64_t rows, int64_t cols, int64_t ld,
                 float* slab, bool read) {
  if (t.dtype != DType::bf16) return {t.f32() + offset, ld};
  if (read)
    for (int64_t r = 0; r < rows; ++r)
      widen_bf16(slab + r * cols, t.bf16() + offset + r * ld, cols);
  return {slab, cols};
}

// A block whose values start at zero, to accumulate a gradient that is written, not added to
// (backend.h): zeroed in place in fp32, as a zeroed slab over a bf16 tensor.
Block open_zeroed_block(const Tensor& t, int64_t offset, int64_t rows, int64_t cols, int64_t ld,
                        float* slab) {
  const Block b = open_block(t, offset, rows, cols, ld, slab, false);
  for (int64_t r = 0; r < rows; ++r) std::memset(b.p + r * b.ld, 0, sizeof(float) * size_t(cols));
  return b;
}

// Rounds a block opened on a bf16 tensor back into it.
void close_block(const Tensor& t, int64_t offset, int64_t rows, int64_t cols, int64_t ld,
                 const Block& b) {
  if (t.dtype != DType::bf16) return;
  for (int64_t r = 0; r < rows; ++r) narrow_bf16(t.bf16() + offset + r * ld, b.p + r * cols, cols);
}

}  // namespace

int64_t CpuBackend::attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads,
                                              int64_t kv_heads, int64_t head_dim, DType dtype) {
  const int64_t nt = omp_get_max_threads();
  return nt * 2 * kQueryBlock * seq * int64_t(sizeof(float));  // do_attention_backward's scores
}

CpuBackend::AttentionDims CpuBackend::attention_dims(const Tensor& q, const Tensor& k) {
  AttentionDims d{q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.shape[3], 0, 0.0f};
  d.rep = d.H / d.Hkv;
  d.scale = 1.0f / std::sqrt(float(d.hd));
  return d;
}

void CpuBackend::do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) {
  const AttentionDims d = attention_dims(q, k);
  const int64_t nt = omp_get_max_threads();
  float* scratch = attn_ws_.get(size_t(nt) * kQueryBlock * d.S);  // [threads, block, S]
  // Per thread: K, V [S, hd]; the block's Q, O [block, hd].
  const Slabs slabs(slab_ws_, kAttentionSlabs, std::max(d.S, kQueryBlock) * d.hd,
                    any_bf16({out, q, k, v}));
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < d.B * d.H; ++item) {
    const int64_t b = item / d.H, h = item % d.H, g = h / d.rep;
    float* sc = scratch + size_t(omp_get_thread_num()) * kQueryBlock * d.S;
    const int64_t ldq = d.H * d.hd, ldk = d.Hkv * d.hd;
    const int64_t q0 = (b * d.S * d.H + h) * d.hd, k0 = (b * d.S * d.Hkv + g) * d.hd;
    const Block K = open_block(k, k0, d.S, d.hd, ldk, slabs.get(0), true);
    const Block V = open_block(v, k0, d.S, d.hd, ldk, slabs.get(1), true);
    const int64_t l0 = (b * d.H + h) * d.S;
    for (int64_t r0 = 0; r0 < d.S; r0 += kQueryBlock) {
      const int64_t rows = std::min(kQueryBlock, d.S - r0), keys = r0 + rows;
      const int64_t at = q0 + r0 * ldq;
      const Block Q = open_block(q, at, rows, d.hd, ldq, slabs.get(2), true);
      const Block O = open_block(out, at, rows, d.hd, ldq, slabs.get(3), false);
      sgemm('N', 'T', rows, keys, d.hd, d.scale, Q.p, Q.ld, K.p, K.ld, 0.0f, sc, keys);
      for (int64_t t = 0; t < rows; ++t) {
        float* row = sc + t * keys;
        const int64_t valid = r0 + t + 1;
        store(lse, l0 + r0 + t, log_sum_exp(softmax_in_place(row, row, valid)));
        for (int64_t j = valid; j < keys; ++j) row[j] = 0.0f;
      }
      sgemm('N', 'N', rows, d.hd, keys, 1.0f, sc, keys, V.p, V.ld, 0.0f, O.p, O.ld);
      close_block(out, at, rows, d.hd, ldq, O);
    }
  }
}

void CpuBackend::do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out,
                                       Tensor lse, Tensor q, Tensor k, Tensor v) {
  const AttentionDims d = attention_dims(q, k);
  const int64_t nt = omp_get_max_threads();
  float* scratch = attn_ws_.get(size_t(nt) * 2 * kQueryBlock * d.S);  // [threads, 2, block, S]
  // Per thread: K, V, dK, dV [S, hd]; the block's Q, O, dO, dQ [block, hd].
  const Slabs slabs(slab_ws_, kAttentionBackwardSlabs, std::max(d.S, kQueryBlock) * d.hd,
                    any_bf16({dq, dk, dv, dout, out, q, k, v}));
  // One item per (batch, kv head): its dK and dV rows are written by it alone.
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t item = 0; item < d.B * d.Hkv; ++item) {
    const int64_t b = item / d.Hkv, g = item % d.Hkv;
    float* p = scratch + size_t(omp_get_thread_num()) * 2 * kQueryBlock * d.S;
    float* ds = p + kQueryBlock * d.S;
    const int64_t ldq = d.H * d.hd, ldk = d.Hkv * d.hd;
    const int64_t k0 = (b * d.S * d.Hkv + g) * d.hd;
    const Block K = open_block(k, k0, d.S, d.hd, ldk, slabs.get(0), true);
    const Block V = open_block(v, k0, d.S, d.hd, ldk, slabs.get(1), true);
    // dq, dk, dv are written (backend.h): dK and dV sum over the group's heads and query
    // blocks from zero; each dQ block is one GEMM's product.
    const Block dK = open_zeroed_block(dk, k0, d.S, d.hd, ldk, slabs.get(2));
    const Block dV = open_zeroed_block(dv, k0, d.S, d.hd, ldk, slabs.get(3));
    for (int64_t h = g * d.rep; h < (g + 1) * d.rep; ++h) {
      const int64_t head = (b * d.S * d.H + h) * d.hd;
      const int64_t l0 = (b * d.H + h) * d.S;
      for (int64_t r0 = 0; r0 < d.S; r0 += kQueryBlock) {
        const int64_t rows = std::min(kQueryBlock, d.S - r0), keys = r0 + rows;
        const int64_t at = head + r0 * ldq;
        const Block Q = open_block(q, at, rows, d.hd, ldq, slabs.get(4), true);
        const Block O = open_block(out, at, rows, d.hd, ldq, slabs.get(5), true);
        const Block dO = open_block(dout, at, rows, d.hd, ldq, slabs.get(6), true);
        const Block dQ = open_block(dq, at, rows, d.hd, ldq, slabs.get(7), false);
        // P = exp(Q Kᵀ/√hd − lse), dP = dO Vᵀ, dS = P ⊙ (dP − rowsum(dO ⊙ O))
        sgemm('N', 'T', rows, keys, d.hd, d.scale, Q.p, Q.ld, K.p, K.ld, 0.0f, p, keys);
        sgemm('N', 'T', rows, keys, d.hd, 1.0f, dO.p, dO.ld, V.p, V.ld, 0.0f, ds, keys);
        for (int64_t t = 0; t < rows; ++t) {
          float *pr = p + t * keys, *dr = ds + t * keys;
          const float *o = O.p + t * O.ld, *go = dO.p + t * dO.ld;
          float delta = 0.0f;
#pragma omp simd reduction(+ : delta)
          for (int64_t e = 0; e < d.hd; ++e) delta += o[e] * go[e];
          const int64_t valid = r0 + t + 1;
          const float l = load(lse, l0 + r0 + t);
#pragma omp simd
          for (int64_t j = 0; j < valid; ++j) {
            pr[j] = fast_exp(pr[j] - l);
            dr[j] = pr[j] * (dr[j] - delta);
          }
          for (int64_t j = valid; j < keys; ++j) pr[j] = dr[j] = 0.0f;
        }
        // dV += Pᵀ dO;  dQ = dS K / √hd;  dK += dSᵀ Q / √hd
        sgemm('T', 'N', keys, d.hd, rows, 1.0f, p, keys, dO.p, dO.ld, 1.0f, dV.p, dV.ld);
        sgemm('N', 'N', rows, d.hd, keys, d.scale, ds, keys, K.p, K.ld, 0.0f, dQ.p, dQ.ld);
        sgemm('T', 'N', keys, d.hd, rows, d.scale, ds, keys, Q.p, Q.ld, 1.0f, dK.p, dK.ld);
        close_block(dq, at, rows, d.hd, ldq, dQ);
      }
    }
    close_block(dk, k0, d.S, d.hd, ldk, dK);
    close_block(dv, k0, d.S, d.hd, ldk, dV);
  }
}

}  // namespace bottle::cpu
