#pragma once
// cuDNN's deterministic SDPA backward: which engine runs it and the device workspace it needs,
// known from the shape before any cuDNN graph is built, so that the memory plan counts it and
// the run's first line says which backward runs and why. Free of cuDNN and CUDA: the memory
// plan and its tests use it on any machine; the cuda backend asks it for the GPU it has.
//
// cudnn-frontend (1.32, scaled_dot_product_flash_attention.h) serves a deterministic backward
// in one of two ways:
//   - the dP workspace: the [B, H, S, S] bf16 score gradients in device memory, about
//     B·H·S²·2 bytes (512 MiB at 4 × 16 heads × 2048, 4 GiB at 4 × 32 × 4096, 16 GiB at
//     S = 8192). The only deterministic engine before cuDNN 9.25, and on every GPU but Hopper;
//   - the ordered dQ accumulation (Hopper, cuDNN ≥ 9.25): the fp32 dQ sums in a fixed order,
//     a workspace linear in S, somewhat slower. The frontend takes it only when its caller
//     bounds the dP workspace below the shape's need (CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT).
// bottle sets that bound to kSdpaDpWorkspaceBound unless the user set the variable; the
// frontend then decides by the same formula as sdpa_dp_workspace_bytes.
#include <cstddef>
#include <cstdint>
#include <string>

namespace bottle {

// Above this dP workspace (per rank, per attention call), a Hopper GPU with cuDNN ≥ 9.25 runs
// the ordered-dQ backward: 1 GiB keeps the faster dP path for the usual pre-training shapes
// (4 × 16 heads × 2048 needs 512 MiB) and the linear one for long sequences.
inline constexpr int64_t kSdpaDpWorkspaceBound = int64_t(1) << 30;
// The first cuDNN version with the ordered-dQ deterministic backward (cudnnGetVersion()).
inline constexpr size_t kCudnnOrderedDqVersion = 92500;
// The environment variable the frontend reads when it builds a backward graph.
inline constexpr const char* kCudnnDpWorkspaceLimitVariable = "CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT";

// The dP workspace of a [batch, seq, heads, ·] causal self-attention's backward, with the
// frontend's padding (queries to 64, keys to 128): batch · heads · ⌈S⌉64 · ⌈S⌉128 · 2 bytes.
int64_t sdpa_dp_workspace_bytes(int64_t batch, int64_t heads, int64_t seq);

// What the backward of one attention shape will run and need.
struct SdpaBackwardPlan {
  bool ordered_dq = false;      // the linear-workspace engine; else the dP workspace
  int64_t dp_bytes = 0;         // the dP workspace the shape would need
  int64_t workspace_bytes = 0;  // planned device workspace of the backward (an upper bound)
  std::string reason;           // why this engine, for the run's first line
};

// The backward cuDNN will run for q [batch, seq, heads, head_dim] on a GPU of compute
// capability `sm_major`.x with cuDNN `cudnn_version` (cudnnGetVersion()), under the dP bound
// `limit` (the user's CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT when set, else
// kSdpaDpWorkspaceBound; -1 unbounded, 0 never the dP workspace where another engine exists).
SdpaBackwardPlan plan_sdpa_backward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                    int sm_major, size_t cudnn_version, int64_t limit);

// The dP bound in force: the environment's CUDNN_FRONTEND_ATTN_DP_WORKSPACE_LIMIT when it is an
// integer, else kSdpaDpWorkspaceBound.
int64_t sdpa_dp_workspace_limit();

}  // namespace bottle
