#pragma once
// The cuda backend's memory beside its ops: device blocks from cudaMalloc, freed once the
// stream has finished with them; small tables the kernels read, uploaded only when they
// change; and pinned staging slots for the small host-to-device copies a step makes.
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "backend/cuda/growing_buffer.h"

namespace bottle::cuda {

// cudaMalloc and cudaFree for the growing buffers (growing_buffer.h) and the arenas' blocks,
// on the backend's device and stream: a block is freed once the stream has finished with it
// (a wait, counted in *host_waits), and a failure names what wanted the memory, its size and
// the GPU's free memory.
struct DeviceMemory {
  cudaStream_t stream = nullptr;
  int device = 0;
  int64_t* host_waits = nullptr;  // the backend's count of waits for the device

  void* try_allocate(size_t bytes);
  // Unchecked, as the backend's destructor frees too: a fault is reported by the next
  // launch's check.
  void release(void* block);
  [[noreturn]] void fail(size_t bytes, const char* what);
};

// A small table the kernels read (ranges, decay gaps, RoPE's cos and sin), kept on the device
// and uploaded again only when its contents change: a step passes the same table every time.
class DeviceTable {
 public:
  // The device copy of `bytes` bytes at `data` (null for none), uploaded on the memory's
  // stream when they differ from the last ones. The host copy changes only once the device
  // block holds the new size, so that a failed allocation leaves the table as it was.
  void* upload(DeviceMemory& memory, const void* data, size_t bytes, const char* what);
  void* data() const { return device_.data(); }
  void clear(DeviceMemory& memory) { device_.clear(memory); }

 private:
  GrowingBuffer<DeviceMemory> device_;
  std::vector<unsigned char> host_;  // the bytes device_ holds
};

// Pinned host memory in slots for from_host's small copies (a batch of token ids): the caller
// may reuse its own buffer at once, the copy travels from the slot while the host goes on, and
// a slot is reused once its own copy has completed, which by then it almost always has.
class PinnedStaging {
 public:
  static constexpr size_t kSlotBytes = size_t(1) << 20;

  PinnedStaging() = default;
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  ~PinnedStaging();  // once the stream is idle

  // Copies `bytes` (at most kSlotBytes) from `src` to the device at `dst` on `stream`, through
  // the next slot; waits (counted in *host_waits) only while that slot's last copy is in
  // flight.
  void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, int64_t* host_waits);

 private:
  static constexpr size_t kSlots = 8;

  void* base_ = nullptr;           // pinned, kSlots × kSlotBytes, allocated on first use
  std::vector<cudaEvent_t> done_;  // per slot: its last copy has completed
  size_t next_ = 0;
};

}  // namespace bottle::cuda
