#pragma once
// The cuda backend's GEMM: cuBLASLt behind one call. bottle's row-major
// C = alpha op(A) op(B) + beta C is, read column-major, Cᵀ = op(B)ᵀ op(A)ᵀ, so cuBLASLt
// (column-major) multiplies B by A with the same transposes and m, n swapped. The matrix
// layouts and the algorithm cuBLASLt's heuristic picks are kept per problem for the run: a
// training step repeats the same few shapes.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <set>
#include <tuple>

#include "backend/backend.h"

namespace bottle::cuda {

class GemmLt {
 public:
  GemmLt();
  ~GemmLt();
  GemmLt(const GemmLt&) = delete;
  GemmLt& operator=(const GemmLt&) = delete;

  // g on `stream`, with m, n, k ≥ 1, in a mix cuBLASLt takes: f32 × f32 → f32, or bf16 × bf16 →
  // bf16 or f32, with fp32 compute. A batched problem that cuBLASLt has no algorithm for runs
  // as its single items (said once per shape on stderr); any other problem without one fails,
  // naming its shape.
  void run(const GemmArgs& g, cudaStream_t stream);

 private:
  static constexpr size_t kWorkspaceBytes = size_t(32) << 20;  // cuBLASLt's Hopper advice

  void run_items(const GemmArgs& g, cudaStream_t stream);
  cublasLtMatrixLayout_t layout(DType t, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
                                int64_t stride);

  // A problem: its transposes, sizes, leading dimensions, strides, batch, dtypes and the
  // alignments of its operands.
  using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                         int64_t, int64_t, int64_t, int, int, int, uint32_t, uint32_t, uint32_t>;
  struct Plan {
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;  // kWorkspaceBytes on the device
  // One layout per distinct (dtype, rows, cols, ld, batch, stride).
  std::map<std::tuple<int, int64_t, int64_t, int64_t, int64_t, int64_t>, cublasLtMatrixLayout_t>
      layouts_;
  std::map<Key, Plan> plans_;
  std::set<Key> items_only_;  // batched problems cuBLASLt has no algorithm for
};

}  // namespace bottle::cuda
