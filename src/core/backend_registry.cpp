// The one place that knows which backends exist; optional ones are added here behind
// their build flag.
#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.h>

#include "core/cpu_backend.h"
#include "core/reference_backend.h"
#include "core/widening_backend.h"

namespace bottle {

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return std::make_unique<WideningBackend>(make_cpu_backend());
  if (name == "reference") return std::make_unique<WideningBackend>(make_reference_backend());
  fail("unknown backend '{}' (available: cpu, reference)", name);
}

Backend& host_backend() {
  static const std::unique_ptr<Backend> host = make_backend("cpu");
  return *host;
}

std::vector<std::string> backend_names() {
  const dnnl_version_t* dnnl = dnnl_version();
  return {fmt::format("cpu: oneDNN {}.{}.{} GEMMs + OpenMP {}", dnnl->major, dnnl->minor,
                      dnnl->patch, _OPENMP),
          "reference: naive loops (the test oracle)"};
}

}  // namespace bottle
