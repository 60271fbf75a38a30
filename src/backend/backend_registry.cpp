// The one place that knows which backends exist; optional ones are added here behind
// their build flag.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/dnnl/dnnl.h>

#include "backend/backend_options.h"
#include "backend/cpu_backend.h"
#include "backend/reference_backend.h"
#include "backend/widening_backend.h"
#ifdef BOTTLE_HAVE_CUDA
#include "backend/cuda/cuda_backend.h"
#endif
#ifdef BOTTLE_HAVE_CUDNN
#include "backend/cuda/attention_cudnn.h"
#endif

namespace bottle {

namespace {

std::string unknown_backend(std::string_view name) {
  return fmt::format("unknown backend '{}' (available: {})", name, fmt::join(kBackendNames, ", "));
}

}  // namespace

AttentionChoice parse_attention_choice(std::string_view name) {
  for (size_t i = 0; i < kAttentionChoiceNames.size(); ++i)
    if (name == kAttentionChoiceNames[i]) return AttentionChoice(i);
  fail("unknown attention '{}' (choose {})", name, fmt::join(kAttentionChoiceNames, ", "));
}

bool is_host_backend(std::string_view name) {
  return name == "cpu" || name == "cpu-widened" || name == "reference";
}

std::vector<std::string> host_backend_names() {
  std::vector<std::string> names;
  for (const char* name : kBackendNames)
    if (is_host_backend(name)) names.emplace_back(name);
  return names;
}

std::unique_ptr<Backend> make_backend(std::string_view name) { return make_backend(name, {}); }

std::unique_ptr<Backend> make_backend(std::string_view name, const BackendOptions& options) {
  if (is_host_backend(name) && options.attention == AttentionChoice::cudnn)
    fail(
        "backend '{}' has no cuDNN attention (attention \"cudnn\" runs on the cuda backend); "
        "choose \"auto\" or \"own\"",
        name);
  // cpu's kernels take bf16 themselves (src/backend/cpu/kernels.h); the reference computes in
  // fp32 and is widened, which makes it the exact oracle of bf16 storage. "cpu-widened", the
  // cpu kernels behind the widening backend as they ran before they took bf16, is kept as a
  // fallback to name (tests hold the native kernels to its bits).
  if (name == "cpu") return make_cpu_backend();
  if (name == "cpu-widened") return std::make_unique<WideningBackend>(make_cpu_backend());
  if (name == "reference") return std::make_unique<WideningBackend>(make_reference_backend());
  if (name == "cuda") {
#ifdef BOTTLE_HAVE_CUDA
    // cuDNN's attention where this build has it; without, the backend says why it has none.
#ifdef BOTTLE_HAVE_CUDNN
    return make_cuda_backend(options.attention, &cuda::load_cudnn_attention);
#else
    return make_cuda_backend(options.attention, nullptr);
#endif
#else
    fail("backend 'cuda': {}", backend_unavailable("cuda"));
#endif
  }
  fail("{}", unknown_backend(name));
}

std::string backend_unavailable(std::string_view name) {
  if (is_host_backend(name)) return {};
  if (name == "cuda") {
#ifdef BOTTLE_HAVE_CUDA
    return cuda_unavailable();
#else
    return "this build has no CUDA backend (configured with BOTTLE_CUDA=OFF, or no CUDA toolkit "
           "with NCCL was found)";
#endif
  }
  return unknown_backend(name);
}

Backend& host_backend() {
  static const std::unique_ptr<Backend> host = make_backend("cpu");
  return *host;
}

std::vector<std::string> backend_names() {
  const dnnl_version_t* dnnl = dnnl_version();
  std::vector<std::string> names{fmt::format("cpu: oneDNN {}.{}.{} GEMMs + OpenMP {}", dnnl->major,
                                             dnnl->minor, dnnl->patch, _OPENMP),
                                 "reference: naive loops (the test oracle)"};
#ifdef BOTTLE_HAVE_CUDA
  names.push_back(cuda_description());
  // Which attention a bf16 run on the GPU would get, known before any run: cuDNN's SDPA where
  // the library loads (asked without a GPU), else the own kernels, saying why.
#ifdef BOTTLE_HAVE_CUDNN
  names.push_back("cuda attention: " + cuda::cudnn_library_status());
#else
  names.push_back(
      "cuda attention: own kernels only (this build has no cuDNN attention: cudnn-frontend was "
      "not found when it was configured; scripts/setup.sh installs it)");
#endif
#endif
  return names;
}

}  // namespace bottle
