// cuBLASLt behind one call (gemm_lt.h).
#include "backend/cuda/gemm_lt.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "backend/cuda/check.h"
#include "core/error.h"

namespace bottle::cuda {
namespace {

cudaDataType_t cuda_type(DType t) { return t == DType::bf16 ? CUDA_R_16BF : CUDA_R_32F; }

// The largest power of two, up to 256, that divides every address a GEMM operand takes:
// cuBLASLt assumes 256-byte alignment unless told, and views into arenas, column slices and
// batch strides are often less aligned.
uint32_t alignment_of(const void* p, int64_t stride_bytes, int64_t batch) {
  uint64_t bits = reinterpret_cast<uintptr_t>(p) | 256u;
  if (batch > 1 && stride_bytes) bits |= uint64_t(stride_bytes);
  return uint32_t(bits & (~bits + 1));
}

}  // namespace

GemmLt::GemmLt() {
  check_cublas(cublasLtCreate(&lt_), "cublasLtCreate");
  if (const cudaError_t status = cudaMalloc(&workspace_, kWorkspaceBytes); status != cudaSuccess) {
    cudaGetLastError();  // cleared, so that later calls are unaffected
    cublasLtDestroy(lt_);
    check_cuda(status, "cudaMalloc (GEMM workspace)");
  }
}

GemmLt::~GemmLt() {
  for (auto& [key, layout] : layouts_) cublasLtMatrixLayoutDestroy(layout);
  for (auto& [key, plan] : plans_) cublasLtMatmulDescDestroy(plan.desc);
  cudaFree(workspace_);
  cublasLtDestroy(lt_);
}

cublasLtMatrixLayout_t GemmLt::layout(DType t, int64_t rows, int64_t cols, int64_t ld,
                                      int64_t batch, int64_t stride) {
  const auto key = std::make_tuple(int(t), rows, cols, ld, batch, stride);
  if (auto it = layouts_.find(key); it != layouts_.end()) return it->second;
  cublasLtMatrixLayout_t l = nullptr;
  check_cublas(cublasLtMatrixLayoutCreate(&l, cuda_type(t), uint64_t(rows), uint64_t(cols), ld),
               "cublasLtMatrixLayoutCreate");
  layouts_.emplace(key, l);  // owned from here, also when an attribute below fails
  if (batch > 1) {
    const int32_t count = int32_t(batch);
    check_cublas(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count,
                                                  sizeof count),
                 "batch count");
    check_cublas(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &stride, sizeof stride),
                 "batch stride");
  }
  return l;
}

void GemmLt::run(const GemmArgs& g, cudaStream_t stream) {
  // cuBLASLt's problem: (n × m) = op(B') (n × k) · op(A') (k × m), where B' is B's storage
  // read column-major and A' is A's.
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int64_t b_rows = g.trans_b ? g.k : g.n, b_cols = g.trans_b ? g.n : g.k;
  const int64_t a_rows = g.trans_a ? g.m : g.k, a_cols = g.trans_a ? g.k : g.m;
  const size_t ea = dtype_size(g.a_dtype), eb = dtype_size(g.b_dtype), ec = dtype_size(g.c_dtype);
  // C_in (cuBLASLt's C) takes D's layout; its alignment is the lesser of the two.
  const uint32_t align_a = alignment_of(g.a, g.stride_a * int64_t(ea), g.batch),
                 align_b = alignment_of(g.b, g.stride_b * int64_t(eb), g.batch),
                 align_c = std::min(alignment_of(g.c, g.stride_c * int64_t(ec), g.batch),
                                    alignment_of(g.c_read(), g.stride_c * int64_t(ec), g.batch));
  cublasLtMatrixLayout_t lb = layout(g.b_dtype, b_rows, b_cols, g.ldb, g.batch, g.stride_b);
  cublasLtMatrixLayout_t la = layout(g.a_dtype, a_rows, a_cols, g.lda, g.batch, g.stride_a);
  cublasLtMatrixLayout_t lc = layout(g.c_dtype, g.n, g.m, g.ldc, g.batch, g.stride_c);

  const Key key{
      g.trans_a,      g.trans_b,  g.m,        g.n,        g.k,     g.lda,          g.ldb,
      g.ldc,          g.stride_a, g.stride_b, g.stride_c, g.batch, int(g.a_dtype), int(g.b_dtype),
      int(g.c_dtype), align_a,    align_b,    align_c};
  if (items_only_.count(key)) return run_items(g, stream);
  auto it = plans_.find(key);
  if (it == plans_.end()) {
    Plan plan;
    check_cublas(cublasLtMatmulDescCreate(&plan.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                 "cublasLtMatmulDescCreate");
    check_cublas(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_b, sizeof op_b),
        "transa");
    check_cublas(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_a, sizeof op_a),
        "transb");
    cublasLtMatmulPreference_t pref = nullptr;
    check_cublas(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
    const uint64_t workspace = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                         sizeof workspace);
    // cuBLASLt's A is our B and its B our A.
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_b,
                                         sizeof align_b);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_a,
                                         sizeof align_a);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c,
                                         sizeof align_c);
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c,
                                         sizeof align_c);
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t status =
        cublasLtMatmulAlgoGetHeuristic(lt_, plan.desc, lb, la, lc, lc, pref, 1, &result, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if ((status != CUBLAS_STATUS_SUCCESS || found == 0) && g.batch > 1) {
      // Batched shapes that the heuristic has never met on a GPU (x broadcast with batch
      // stride 0, outputs written as interleaved column blocks): each item is a plain GEMM
      // it does take. Said once per shape; the run goes on.
      cublasLtMatmulDescDestroy(plan.desc);
      items_only_.insert(key);
      fmt::print(stderr,
                 "cuda backend: cuBLASLt has no batched algorithm for a {}{} GEMM m {} n {} k {} "
                 "batch {} (strides {} {} {}; {} × {} → {}): {}; its items run as {} single "
                 "GEMMs\n",
                 g.trans_a ? "T" : "N", g.trans_b ? "T" : "N", g.m, g.n, g.k, g.batch, g.stride_a,
                 g.stride_b, g.stride_c, dtype_name(g.a_dtype), dtype_name(g.b_dtype),
                 dtype_name(g.c_dtype), cublasLtGetStatusString(status), g.batch);
      return run_items(g, stream);
    }
    if (status != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatmulDescDestroy(plan.desc);
      fail(
          "cuda backend: cuBLASLt has no algorithm for a {}{} GEMM m {} n {} k {} batch {} "
          "(lda {} ldb {} ldc {}; {} × {} → {}; alignment {} {} {} bytes): {}",
          g.trans_a ? "T" : "N", g.trans_b ? "T" : "N", g.m, g.n, g.k, g.batch, g.lda, g.ldb, g.ldc,
          dtype_name(g.a_dtype), dtype_name(g.b_dtype), dtype_name(g.c_dtype), align_a, align_b,
          align_c, cublasLtGetStatusString(status));
    }
    plan.algo = result.algo;
    it = plans_.emplace(key, plan).first;
  }
  check_cublas(cublasLtMatmul(lt_, it->second.desc, &g.alpha, g.b, lb, g.a, la, &g.beta, g.c_read(),
                              lc, g.c, lc, &it->second.algo, workspace_, kWorkspaceBytes, stream),
               "cublasLtMatmul");
}

// A batch as its single items, in order (GemmArgs::item); each item's C is its own, so the
// results are the batched GEMM's.
void GemmLt::run_items(const GemmArgs& g, cudaStream_t stream) {
  for (int64_t i = 0; i < g.batch; ++i) run(g.item(i), stream);
}

}  // namespace bottle::cuda
