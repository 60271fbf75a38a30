#pragma once
// The reference backend: every kernel as the plainest naive loop, accumulating in double.
// Slow on purpose; tests use it as the oracle the fast backends are compared against.
#include <memory>

#include "core/backend.h"

namespace bottle {
std::unique_ptr<Backend> make_reference_backend();
}  // namespace bottle
