// The one place that knows which backends exist; optional ones are added here behind
// their build flag. The cuda backend lives in the CUDA module (backend/cuda/cuda_module.h),
// opened here when a run first asks for it, so that bottle itself links no CUDA library.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/dnnl/dnnl.h>

#include "backend/backend_options.h"
#include "backend/cpu_backend.h"
#include "backend/reference_backend.h"
#include "backend/widening_backend.h"
#ifdef BOTTLE_HAVE_CUDA
#include "backend/cuda/cuda_module.h"
#include "backend/gpu_module.h"
#endif

namespace bottle {

namespace {

std::string unknown_backend(std::string_view name) {
  return fmt::format("unknown backend '{}' (available: {})", name, fmt::join(kBackendNames, ", "));
}

#ifdef BOTTLE_HAVE_CUDA
// The CUDA module's table, or null with `why` saying what could not be loaded and what to do.
// `path` (if given) is set to the module's file.
const cuda::ModuleApi* cuda_module(std::string* why, std::string* path = nullptr) {
  const GpuModule& module = open_gpu_module(cuda::kModuleFile, cuda::kModuleEntry);
  if (path) *path = module.path;
  if (!module.api)
    *why = fmt::format(
        "this build's CUDA module could not be loaded ({}); the cuda backend needs {} beside "
        "the bottle binary and the CUDA 13 runtime and cuBLASLt (libcudart.so.13, "
        "libcublasLt.so.13: install them or add their folder to LD_LIBRARY_PATH; they map over "
        "half a gigabyte, which a small `ulimit -v` refuses)",
        module.why, cuda::kModuleFile);
  return static_cast<const cuda::ModuleApi*>(module.api);
}
#endif

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
    std::string why;
    if (const cuda::ModuleApi* module = cuda_module(&why))
      return module->make_backend(options.attention);
    fail("backend 'cuda': {}", why);
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
    std::string why;
    const cuda::ModuleApi* module = cuda_module(&why);
    return module ? module->unavailable() : why;
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
  // Which attention a bf16 run on the GPU would get comes with the module, which says it
  // without a GPU; a module that cannot be loaded is said instead, with the reason.
  std::string why, path;
  if (const cuda::ModuleApi* module = cuda_module(&why, &path)) {
    names.push_back(module->description());
    names.push_back("cuda attention: " + module->attention_status());
    names.push_back("cuda module: " + path);
  } else {
    names.push_back("cuda: " + why);
  }
#endif
  return names;
}

}  // namespace bottle
