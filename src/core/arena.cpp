#include "core/arena.h"

#include <sys/mman.h>

#include <cstdlib>
#include <cstring>
#include <numeric>

namespace bottle {

const char* memory_tag_name(MemoryTag tag) {
  static constexpr const char* names[] = {"weights",     "gradients", "optimizer",
                                          "activations", "comm",      "workspace"};
  return names[size_t(tag)];
}

MemoryStats& MemoryStats::global() {
  static MemoryStats stats;
  return stats;
}

void MemoryStats::add(MemoryTag tag, size_t bytes) {
  size_t& live = live_[size_t(tag)];
  live += bytes;
  peak_[size_t(tag)] = std::max(peak_[size_t(tag)], live);
  peak_total_ = std::max(peak_total_, live_total());
}

void MemoryStats::sub(MemoryTag tag, size_t bytes) { live_[size_t(tag)] -= bytes; }

size_t MemoryStats::live_total() const {
  return std::accumulate(live_.begin(), live_.end(), size_t(0));
}

size_t MemoryBreakdown::total() const {
  return std::accumulate(bytes.begin(), bytes.end(), size_t(0));
}

size_t aligned_size(size_t bytes) {
  return (std::max<size_t>(bytes, 1) + kAllocationAlignment - 1) / kAllocationAlignment *
         kAllocationAlignment;
}

void Arena::Release::operator()(void* p) const {
  if (reserved)
    munmap(p, bytes);
  else
    std::free(p);
}

Arena::~Arena() {
  if (bytes_ && !reserve_only_) MemoryStats::global().sub(tag_, bytes_);
}

Tensor Arena::alloc(Shape shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t rounded = aligned_size(t.nbytes());
  void* p = nullptr;
  if (reserve_only_) {
    // Address space only: PROT_NONE and MAP_NORESERVE commit no memory.
    p = mmap(nullptr, rounded, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    BOTTLE_CHECK(p != MAP_FAILED, "cannot reserve {} bytes of address space for {}", rounded,
                 memory_tag_name(tag_));
  } else {
    p = std::aligned_alloc(kAllocationAlignment, rounded);
    BOTTLE_CHECK(p != nullptr, "out of memory allocating {} bytes of {}", rounded,
                 memory_tag_name(tag_));
    std::memset(p, 0, rounded);
    MemoryStats::global().add(tag_, rounded);
  }
  blocks_.emplace_back(p, Release{rounded, reserve_only_});
  bytes_ += rounded;
  t.data = p;
  return t;
}

Tensor RegionAllocator::alloc(Shape shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t rounded = aligned_size(t.nbytes());
  BOTTLE_CHECK(offset_ + rounded <= region_.nbytes(),
               "{}: the shared region of {} bytes is too small for {} more bytes at {}", what_,
               region_.nbytes(), rounded, offset_);
  t.data = static_cast<char*>(region_.data) + offset_;
  offset_ += rounded;
  return t;
}

}  // namespace bottle
