#pragma once
// Loops over host buffers outside the backends: filling a host staging buffer before
// Backend::from_host (parameter initialisation, checkpoint slices). Tensor data itself is
// only touched by backends.
#include <cstdint>

namespace bottle {

// body(i) for i in [0, n), split statically over the OpenMP threads.
template <typename Body>
void host_parallel_for(int64_t n, Body body) {
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) body(i);
}

}  // namespace bottle
