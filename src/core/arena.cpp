#include "core/arena.h"

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

void Arena::FreeDeleter::operator()(void* p) const { std::free(p); }

Arena::~Arena() {
  if (bytes_) MemoryStats::global().sub(tag_, bytes_);
}

Tensor Arena::alloc(Shape shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t bytes = t.nbytes();
  const size_t rounded = (std::max<size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded);
  BOTTLE_CHECK(p != nullptr, "out of memory allocating {} bytes of {}", rounded,
               memory_tag_name(tag_));
  std::memset(p, 0, rounded);
  blocks_.emplace_back(p);
  bytes_ += rounded;
  MemoryStats::global().add(tag_, rounded);
  t.data = p;
  return t;
}

}  // namespace bottle
