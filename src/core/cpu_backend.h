#pragma once
#include <memory>

#include "core/backend.h"

namespace bottle {
std::unique_ptr<Backend> make_cpu_backend();
}  // namespace bottle
