#pragma once
// Arenas own memory. Each allocation is tagged with what it holds so that peak memory can
// be reported per purpose (weights / gradients / optimizer / activations / comm / workspace).
#include <array>
#include <cstddef>
#include <memory>
#include <vector>

#include "core/tensor.h"

namespace bottle {

enum class MemoryTag : uint8_t {
  weights,
  gradients,
  optimizer,
  activations,
  comm,
  workspace,
  count
};
const char* memory_tag_name(MemoryTag tag);

// Process-wide live and peak bytes per tag.
class MemoryStats {
 public:
  static MemoryStats& global();
  void add(MemoryTag tag, size_t bytes);
  void sub(MemoryTag tag, size_t bytes);
  size_t live(MemoryTag tag) const { return live_[size_t(tag)]; }
  size_t peak(MemoryTag tag) const { return peak_[size_t(tag)]; }
  size_t live_total() const;
  size_t peak_total() const { return peak_total_; }

 private:
  std::array<size_t, size_t(MemoryTag::count)> live_{}, peak_{};
  size_t peak_total_ = 0;
};

// 64-byte aligned, zero-initialised host memory, released when the arena dies.
class Arena {
 public:
  explicit Arena(MemoryTag tag) : tag_(tag) {}
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  Arena(Arena&&) = default;
  Arena& operator=(Arena&&) = default;
  ~Arena();

  Tensor alloc(Shape shape, DType dtype = DType::f32);
  size_t bytes() const { return bytes_; }
  MemoryTag tag() const { return tag_; }

 private:
  struct FreeDeleter {
    void operator()(void* p) const;
  };
  MemoryTag tag_;
  size_t bytes_ = 0;
  std::vector<std::unique_ptr<void, FreeDeleter>> blocks_;
};

}  // namespace bottle
