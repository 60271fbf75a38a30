#pragma once
// cuDNN 9's fused scaled-dot-product attention (SDPA, flash attention) for the cuda backend,
// through NVIDIA's header-only cudnn-frontend graph API. Same contract as
// Backend::attention_forward / attention_backward: causal, GQA, scale 1/sqrt(hd), the
// log-sum-exp [B, H, S] in fp32 kept for backward; bf16 tensors only (cuDNN's SDPA has no fp32).
//
// bottle does not link libcudnn: load_cudnn_attention() dlopens the machine's libcudnn.so.9
// (the frontend's dynamic loading), so one binary runs with or without cuDNN, and a machine
// whose cuDNN is missing falls back to the own kernels, saying why.
//
// Free of cuDNN, frontend and CUDA headers: only attention_cudnn.cpp includes them, and it is
// compiled only when CMake found cudnn-frontend and cudnn.h (BOTTLE_HAVE_CUDNN). The CUDA
// module's entry (cuda_module.cpp), which with the registries alone asks what is compiled in,
// hands load_cudnn_attention to the cuda backend; a build without it passes no loader.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace bottle::cuda {

// One attention problem: q, out [batch, seq, heads, head_dim]; k, v [batch, seq, kv_heads,
// head_dim] (BSHD, contiguous); lse [batch, heads, seq] f32.
struct SdpaShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  auto operator<=>(const SdpaShape&) const = default;
};
// "B 4 S 2048 H 16/16 hd 128", for messages.
std::string describe(const SdpaShape& shape);

// cuDNN's SDPA on one stream, with one forward and one backward graph per shape, built on first
// use (slow: cuDNN compiles kernels) and kept for the run. Every error names the call and the
// shape and fails through bottle's fail().
class CudnnAttention {
 public:
  virtual ~CudnnAttention() = default;
  // "cuDNN 9.19.0 SDPA (fused flash attention, deterministic backward)".
  virtual std::string description() const = 0;
  // cudnnGetVersion() of the library loaded: 91900 for 9.19.0.
  virtual size_t version() const = 0;
  // Builds the shape's graphs unless they are cached. Empty when cuDNN runs the shape, else
  // why not, in cuDNN's words (its support check refused it); asked again, it answers the same.
  virtual std::string prepare(const SdpaShape& shape) = 0;
  // Device workspace the prepared shape's forward / backward graph needs, in bytes.
  virtual size_t forward_workspace_bytes(const SdpaShape& shape) = 0;
  virtual size_t backward_workspace_bytes(const SdpaShape& shape) = 0;
  // out = softmax(q kᵀ / sqrt(hd), causal) v and lse = log Σ exp(q·k / sqrt(hd)), both
  // overwritten; q, k, v, out bf16. `workspace` holds forward_workspace_bytes(shape) bytes.
  virtual void forward(void* out, float* lse, const void* q, const void* k, const void* v,
                       const SdpaShape& shape, void* workspace) = 0;
  // dq, dk, dv = the gradients, bf16, written, as every backward kernel writes its
  // gradients (backend.h). `workspace` holds backward_workspace_bytes(shape) bytes.
  virtual void backward(void* dq, void* dk, void* dv, const void* dout, const void* out,
                        const float* lse, const void* q, const void* k, const void* v,
                        const SdpaShape& shape, void* workspace) = 0;
};

// What load_cudnn_attention gives: the attention, or why there is none (e.g. "libcudnn.so.9:
// cannot open shared object file: No such file or directory").
struct CudnnLoad {
  std::unique_ptr<CudnnAttention> attention;
  std::string why;  // empty when `attention` is set
};

// Opens libcudnn.so.9 (once per process), checks it is cuDNN 9, and makes a cuDNN handle on the
// current device bound to `stream` (the backend's cudaStream_t). Never throws for a machine
// without cuDNN: that is a CudnnLoad with `why` set.
CudnnLoad load_cudnn_attention(void* stream);
using CudnnLoader = CudnnLoad (*)(void* stream);

// The cuDNN this process would load, for `bottle --version`, without a GPU: "cuDNN 9.19.0 SDPA,
// from /usr/lib/.../libcudnn.so.9" or why none loads ("cuDNN not loadable: libcudnn.so.9:
// cannot open shared object file ...").
std::string cudnn_library_status();

}  // namespace bottle::cuda
