// The cuda backend's memory beside its ops (device_memory.h).
#include "backend/cuda/device_memory.h"

#include <algorithm>
#include <cstring>

#include "core/arena.h"
#include "backend/cuda/check.h"
#include "core/error.h"

namespace bottle::cuda {

void* DeviceMemory::try_allocate(size_t bytes) {
  void* p = nullptr;
  if (cudaMalloc(&p, bytes) == cudaSuccess) return p;
  cudaGetLastError();  // clear the error so that later calls are unaffected
  return nullptr;
}

void DeviceMemory::release(void* block) {
  ++*host_waits;
  cudaStreamSynchronize(stream);  // the block's last user has finished
  cudaFree(block);
}

void DeviceMemory::fail(size_t bytes, const char* what) {
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  bottle::fail("out of GPU memory allocating {} for {} on GPU {} ({} free of {})",
               format_bytes(bytes), what, device, format_bytes(free), format_bytes(total));
}

void* DeviceTable::upload(DeviceMemory& memory, const void* data, size_t bytes, const char* what) {
  if (bytes == 0) return nullptr;
  const auto* begin = static_cast<const unsigned char*>(data);
  if (device_.data() && host_.size() == bytes && std::equal(host_.begin(), host_.end(), begin))
    return device_.data();
  host_.clear();  // the device block is about to hold other bytes
  void* device = device_.reserve(memory, bytes, kAllocationAlignment, what);
  host_.assign(begin, begin + bytes);
  // From the kept host copy, which lives until the next change: the copy may still be in
  // flight when this returns. Pageable memory: the runtime stages it before returning.
  check_cuda(cudaMemcpyAsync(device, host_.data(), bytes, cudaMemcpyHostToDevice, memory.stream),
             what);
  return device;
}

PinnedStaging::~PinnedStaging() {
  for (cudaEvent_t e : done_) cudaEventDestroy(e);
  if (base_) cudaFreeHost(base_);
}

void PinnedStaging::copy(void* dst, const void* src, size_t bytes, cudaStream_t stream,
                         int64_t* host_waits) {
  if (!base_) {
    check_cuda(cudaMallocHost(&base_, kSlots * kSlotBytes), "cudaMallocHost");
    for (size_t i = 0; i < kSlots; ++i) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
      done_.push_back(e);
      // Recorded once, so that the first wait on each slot returns at once.
      check_cuda(cudaEventRecord(e, stream), "cudaEventRecord");
    }
  }
  const cudaEvent_t done = done_[next_];
  const cudaError_t state = cudaEventQuery(done);
  if (state == cudaErrorNotReady) {
    ++*host_waits;
    check_cuda(cudaEventSynchronize(done), "from_host (staging slot)");
  } else {
    // Not "not ready": done, or an earlier kernel's fault, reported here rather than lost.
    check_cuda(state, "from_host (staging slot)");
  }
  void* slot = static_cast<char*>(base_) + next_ * kSlotBytes;
  std::memcpy(slot, src, bytes);
  check_cuda(cudaMemcpyAsync(dst, slot, bytes, cudaMemcpyHostToDevice, stream), "from_host");
  check_cuda(cudaEventRecord(done, stream), "from_host");
  next_ = (next_ + 1) % kSlots;
}

}  // namespace bottle::cuda
