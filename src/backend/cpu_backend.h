#pragma once
#include <memory>

#include "backend/backend.h"

namespace bottle {
std::unique_ptr<Backend> make_cpu_backend();
}  // namespace bottle
