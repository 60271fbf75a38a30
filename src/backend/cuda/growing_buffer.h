#pragma once
// A device buffer that grows to the largest request it has seen and is then reused: the cuda
// backend's scratch (attention, widened GEMM operands, norm partial sums) and its small
// uploaded tables. Free of CUDA headers: the backend passes its allocator, so the state rules
// below are tested on the CPU with an allocator that fails on demand
// (tests/backend/test_gpu_host_logic.cpp).
//
// A failed allocation never leaves the buffer pointing at nothing with a size it does not
// have: the new block is allocated into a local first and published only once it exists.
// The old block is kept while the new one is tried, so that a failure leaves the buffer as it
// was; only when both cannot be held at once is the old one released and the new one tried
// again, and if that fails too the buffer is empty (no block, capacity 0), so that a later,
// smaller request allocates anew instead of being handed a null pointer.
#include <cstddef>
#include <utility>

namespace bottle::cuda {

// Allocator: an object with
//   void* try_allocate(size_t bytes);   // nullptr when it cannot (the error kept for fail())
//   void release(void* block);          // after the device has finished with the block
//   [[noreturn]] void fail(size_t bytes, const char* what);  // raises the allocator's error
template <typename Allocator>
class GrowingBuffer {
 public:
  GrowingBuffer() = default;
  GrowingBuffer(const GrowingBuffer&) = delete;
  GrowingBuffer& operator=(const GrowingBuffer&) = delete;

  // A block of at least `bytes` (rounded up to `granule`), the same one as last time when it
  // is large enough. `what` names the user in the allocator's error.
  void* reserve(Allocator& allocator, size_t bytes, size_t granule, const char* what) {
    if (bytes <= capacity_ && block_) return block_;
    const size_t wanted = (bytes + granule - 1) / granule * granule;
    void* fresh = allocator.try_allocate(wanted);
    if (!fresh && block_) {
      // Both may not fit at once: the old block goes first, then the new one is tried again.
      allocator.release(std::exchange(block_, nullptr));
      capacity_ = 0;
      fresh = allocator.try_allocate(wanted);
    }
    if (!fresh) allocator.fail(wanted, what);
    if (block_) allocator.release(block_);
    block_ = fresh;
    capacity_ = wanted;
    return block_;
  }

  // Frees the block (the backend's destructor, once the stream is idle).
  void clear(Allocator& allocator) {
    if (block_) allocator.release(std::exchange(block_, nullptr));
    capacity_ = 0;
  }

  void* data() const { return block_; }
  size_t capacity() const { return capacity_; }

 private:
  void* block_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace bottle::cuda
