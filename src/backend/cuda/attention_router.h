#pragma once
// Which kernels run an attention call on the cuda backend, decided here alone for every
// caller (a training step, eval, bench step and the run's first line alike): cuDNN's SDPA
// (attention_cudnn.h) or the own kernels (kernels.h), by training.attention:
//   own    the own kernels, always; cuDNN is never opened;
//   auto   cuDNN for a bf16 call at a shape its support check accepts, where it loads; else
//          the own kernels, and path() says why;
//   cudnn  as auto, but where cuDNN cannot run the call the run stops, saying why.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>

#include "backend/attention_workspace.h"
#include "backend/backend_options.h"
#include "backend/cuda/attention_cudnn.h"
#include "core/tensor.h"

namespace bottle::cuda {

class AttentionRouter {
 public:
  // Opens cuDNN on `stream` unless `choice` is own; `load` is null in a build without
  // cudnn-frontend. A cuDNN that cannot be opened is remembered with its reason, not thrown:
  // refusal() says whether the choice can stand.
  AttentionRouter(AttentionChoice choice, CudnnLoader load, void* stream, int sm_major);

  // Why attention "cudnn" cannot be honoured here (cuDNN absent); empty when it can, or under
  // another choice.
  std::string refusal() const;

  // The shape cuDNN runs this call at, or nothing where the own kernels run it: cuDNN takes
  // bf16 tensors and an f32 lse, at the shapes its support check accepts. Under "cudnn", a
  // call cuDNN cannot take fails instead, naming `op` and why.
  std::optional<SdpaShape> route(const char* op, const SdpaShape& shape, const Tensor& lse,
                                 std::initializer_list<Tensor> bf16_tensors);
  // cuDNN, once route() has returned a shape.
  CudnnAttention& cudnn() { return *cudnn_; }

  // Which kernels a call at this shape and dtype runs, and why ("own kernels (f32: cuDNN's
  // SDPA takes bf16 only)"); builds cuDNN's graphs for the shape. Fails under "cudnn" where
  // cuDNN cannot run it.
  std::string path(const SdpaShape& shape, DType dtype);
  // The device workspace an attention backward at this shape and dtype takes: cuDNN's
  // planned one, or the own kernels' scratch.
  int64_t workspace_bytes(const SdpaShape& shape, DType dtype) const;

  // cuDNN's handle is bound to the backend's stream: released before the stream is.
  void close() { cudnn_.reset(); }

 private:
  // The engine cuDNN's backward takes for a shape on this GPU, and its planned workspace.
  SdpaBackwardPlan backward_plan(const SdpaShape& shape) const;

  AttentionChoice choice_;
  int sm_major_;                           // the GPU's compute capability, major (9: Hopper)
  std::unique_ptr<CudnnAttention> cudnn_;  // null: the own kernels run every attention
  std::string absent_;                     // why cudnn_ is null (empty under "own")
};

}  // namespace bottle::cuda
