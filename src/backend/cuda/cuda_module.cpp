// The entry point of libbottle_cuda.so (cuda_module.h): the table the backend registry calls.
// Like the registry, this is the one file of the module that asks what the build has
// (BOTTLE_HAVE_CUDNN: cuDNN's attention compiled in).
#include "backend/cuda/cuda_module.h"

#include "backend/cuda/cuda_backend.h"
#include "gpu_module_abi.h"
#ifdef BOTTLE_HAVE_CUDNN
#include "backend/cuda/attention_cudnn.h"
#endif

namespace bottle::cuda {

namespace {

std::unique_ptr<Backend> make_backend(AttentionChoice attention) {
  // cuDNN's attention where this build has it; without, the backend says why it has none.
#ifdef BOTTLE_HAVE_CUDNN
  return make_cuda_backend(attention, &load_cudnn_attention);
#else
  return make_cuda_backend(attention, nullptr);
#endif
}

// Which attention a bf16 run on the GPU would get, known before any run: cuDNN's SDPA where the
// library loads (asked without a GPU), else the own kernels, saying why.
std::string attention_status() {
#ifdef BOTTLE_HAVE_CUDNN
  return cudnn_library_status();
#else
  return "own kernels only (this build has no cuDNN attention: cudnn-frontend was not found "
         "when it was configured; scripts/setup.sh installs it)";
#endif
}

const ModuleApi kApi{BOTTLE_GPU_MODULE_ABI, &cuda_unavailable, &make_backend, &cuda_description,
                     &attention_status};

}  // namespace

}  // namespace bottle::cuda

extern "C" const void* bottle_cuda_module() { return &bottle::cuda::kApi; }
