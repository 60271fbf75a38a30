// The one place that knows which backends exist; optional ones are added here behind
// their build flag.
#include "core/cpu_backend.h"
#include "core/reference_backend.h"

namespace bottle {

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "cpu") return make_cpu_backend();
  if (name == "reference") return make_reference_backend();
  fail("unknown backend '{}' (available: cpu, reference)", name);
}

}  // namespace bottle
