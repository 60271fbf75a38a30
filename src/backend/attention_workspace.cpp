#include "backend/attention_workspace.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstdlib>

#include "core/arena.h"

namespace bottle {

namespace {
int64_t round_up(int64_t x, int64_t to) { return (x + to - 1) / to * to; }
}  // namespace

int64_t sdpa_dp_workspace_bytes(int64_t batch, int64_t heads, int64_t seq) {
  return batch * heads * round_up(seq, 64) * round_up(seq, 128) * 2;
}

SdpaBackwardPlan plan_sdpa_backward(int64_t batch, int64_t seq, int64_t heads, int64_t head_dim,
                                    int sm_major, size_t cudnn_version, int64_t limit) {
  SdpaBackwardPlan p;
  p.dp_bytes = sdpa_dp_workspace_bytes(batch, heads, seq);
  // Either engine keeps dQ's fp32 sums [B, H, S, hd] and the softmax's row sums [B, H, S]:
  // the linear part of the workspace (an upper bound; cuDNN reports the exact size once the
  // graph is built).
  const int64_t linear = batch * heads * round_up(seq, 128) * (head_dim + 1) * 4;
  const bool hopper = sm_major == 9;
  const bool has_ordered_dq = hopper && cudnn_version >= kCudnnOrderedDqVersion;
  const bool above = limit >= 0 && p.dp_bytes > limit;
  p.ordered_dq = has_ordered_dq && above;
  p.workspace_bytes = p.ordered_dq ? linear : p.dp_bytes + linear;
  const std::string dp = format_bytes(size_t(p.dp_bytes));
  const std::string bound = limit < 0 ? std::string("no bound") : format_bytes(size_t(limit));
  if (p.ordered_dq) {
    p.reason = fmt::format(
        "ordered dQ, a workspace linear in the sequence: the dP workspace would take {}, above "
        "the bound of {}",
        dp, bound);
  } else if (!above) {
    p.reason = fmt::format("a dP workspace of {} (within the bound of {})", dp, bound);
  } else if (!hopper) {
    p.reason = fmt::format(
        "a dP workspace of {}, above the bound of {}: on this GPU (sm_{}x) it is cuDNN's only "
        "deterministic backward",
        dp, bound, sm_major);
  } else {
    p.reason = fmt::format(
        "a dP workspace of {}, above the bound of {}: cuDNN {}.{} has no linear-workspace "
        "deterministic backward (9.25 brings it to Hopper)",
        dp, bound, cudnn_version / 10000, cudnn_version / 100 % 100);
  }
  return p;
}

int64_t sdpa_dp_workspace_limit() {
  const char* text = std::getenv(kCudnnDpWorkspaceLimitVariable);
  if (!text || !*text) return kSdpaDpWorkspaceBound;
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text, &end, 10);
  if (errno || *end != '\0') return kSdpaDpWorkspaceBound;
  return int64_t(value);
}

}  // namespace bottle
