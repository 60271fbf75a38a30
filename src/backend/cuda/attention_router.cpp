// The attention router (attention_router.h).
#include "backend/cuda/attention_router.h"

#include <fmt/format.h>

#include "core/arena.h"
#include "backend/cuda/kernels.h"
#include "core/error.h"

namespace bottle::cuda {

AttentionRouter::AttentionRouter(AttentionChoice choice, CudnnLoader load, void* stream,
                                 int sm_major)
    : choice_(choice), sm_major_(sm_major) {
  if (choice_ == AttentionChoice::own) return;
  if (!load) {
    absent_ =
        "this build has no cuDNN attention: cudnn-frontend was not found when it was "
        "configured (scripts/setup.sh installs it)";
    return;
  }
  CudnnLoad loaded = load(stream);
  cudnn_ = std::move(loaded.attention);
  absent_ = loaded.why.empty() ? loaded.why : "cuDNN not loadable: " + loaded.why;
}

std::string AttentionRouter::refusal() const {
  return choice_ == AttentionChoice::cudnn && !cudnn_ ? absent_ : std::string();
}

std::optional<SdpaShape> AttentionRouter::route(const char* op, const SdpaShape& shape,
                                                const Tensor& lse,
                                                std::initializer_list<Tensor> bf16_tensors) {
  if (!cudnn_) return std::nullopt;  // attention "own", or no cuDNN (the constructor said)
  std::string why;
  for (const Tensor& t : bf16_tensors)
    if (t.dtype != DType::bf16 && why.empty())
      why = fmt::format("a {} tensor {} (cuDNN's SDPA takes bf16)", dtype_name(t.dtype),
                        t.shape.str());
  if (why.empty() && lse.dtype != DType::f32)
    why = fmt::format("a {} lse (cuDNN's statistics are f32)", dtype_name(lse.dtype));
  if (why.empty()) why = cudnn_->prepare(shape);
  if (why.empty()) return shape;
  BOTTLE_CHECK(choice_ != AttentionChoice::cudnn,
               "cuda backend: {}: attention \"cudnn\" was chosen, but {}", op, why);
  return std::nullopt;
}

std::string AttentionRouter::path(const SdpaShape& shape, DType dtype) {
  const char* own = "own kernels";
  if (choice_ == AttentionChoice::own) return fmt::format("{} (attention \"own\")", own);
  if (!cudnn_) return fmt::format("{} ({})", own, absent_);
  if (dtype != DType::bf16) {
    BOTTLE_CHECK(choice_ != AttentionChoice::cudnn,
                 "cuda backend: attention \"cudnn\" was chosen, but the run is {}: cuDNN's "
                 "SDPA takes bf16 only (training.precision = \"bf16\")",
                 dtype_name(dtype));
    return fmt::format("{} ({}: cuDNN's SDPA takes bf16 only)", own, dtype_name(dtype));
  }
  if (std::string why = cudnn_->prepare(shape); !why.empty()) {
    BOTTLE_CHECK(choice_ != AttentionChoice::cudnn,
                 "cuda backend: attention \"cudnn\" was chosen, but {}", why);
    return fmt::format("{} ({})", own, why);
  }
  const SdpaBackwardPlan backward = backward_plan(shape);
  return fmt::format("{}; its deterministic backward through {}, workspace {}",
                     cudnn_->description(), backward.reason,
                     format_bytes(cudnn_->backward_workspace_bytes(shape)));
}

int64_t AttentionRouter::workspace_bytes(const SdpaShape& s, DType dtype) const {
  const bool cudnn = cudnn_ && choice_ != AttentionChoice::own && dtype == DType::bf16;
  if (!cudnn)
    return int64_t(
        attention_backward_scratch_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim));
  return backward_plan(s).workspace_bytes;
}

SdpaBackwardPlan AttentionRouter::backward_plan(const SdpaShape& s) const {
  return plan_sdpa_backward(s.batch, s.seq, s.heads, s.head_dim, sm_major_, cudnn_->version(),
                            sdpa_dp_workspace_limit());
}

}  // namespace bottle::cuda
