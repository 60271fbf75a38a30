#pragma once
// Where an arena's memory comes from. The core knows only this: a backend (backend/backend.h)
// is a memory source for its device, and host_memory() is the host's, so that arenas, tensors
// and the code that lays out buffers sit below the backends that compute on them.
#include <cstddef>

#include "core/dtype.h"

namespace bottle {

class MemorySource {
 public:
  virtual ~MemorySource() = default;
  // The device the memory lives on, stamped on every tensor allocated from it.
  virtual Device device() const = 0;
  // `bytes` of zeroed memory aligned to kAllocationAlignment (core/arena.h); fails naming
  // `what` and the size.
  virtual void* allocate(size_t bytes, const char* what) = 0;
  virtual void deallocate(void* p, size_t bytes) = 0;
};

// The process's host memory: arenas that are not given a source (host workspaces, tests,
// tools) allocate from it, and so does the host backends' allocate().
MemorySource& host_memory();

}  // namespace bottle
