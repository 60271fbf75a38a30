#include "core/memory_source.h"

#include <cstdlib>
#include <cstring>

#include "core/arena.h"
#include "core/error.h"

namespace bottle {
namespace {

class HostMemory final : public MemorySource {
 public:
  Device device() const override { return Device::cpu; }
  void* allocate(size_t bytes, const char* what) override {
    const size_t rounded = aligned_size(bytes);
    void* p = std::aligned_alloc(kAllocationAlignment, rounded);
    BOTTLE_CHECK(p != nullptr, "out of memory allocating {} for {}", format_bytes(rounded), what);
    std::memset(p, 0, rounded);
    return p;
  }
  void deallocate(void* p, size_t) override { std::free(p); }
};

}  // namespace

MemorySource& host_memory() {
  static HostMemory memory;
  return memory;
}

}  // namespace bottle
