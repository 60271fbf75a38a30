#pragma once
// Arenas own memory. Each allocation is tagged with what it holds so that peak memory can
// be reported per purpose (weights / gradients / optimizer / activations / comm / workspace).
#include <array>
#include <cstddef>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/memory_source.h"
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
  // Peaks from now on start at what is live (after a one-off probe, before the real work).
  void reset_peaks();

 private:
  std::array<size_t, size_t(MemoryTag::count)> live_{}, peak_{};
  size_t peak_total_ = 0;
};

// Bytes per tag: a rank's footprint, measured or planned.
struct MemoryBreakdown {
  std::array<size_t, size_t(MemoryTag::count)> bytes{};
  // Of bytes[workspace]: the attention's device workspace (cuDNN's backward), named apart in
  // describe_memory because it grows with the square of the sequence.
  size_t attention = 0;
  size_t& operator[](MemoryTag tag) { return bytes[size_t(tag)]; }
  size_t operator[](MemoryTag tag) const { return bytes[size_t(tag)]; }
  size_t total() const;
};

// "20GiB", "512 MB", "1073741824": bytes, with an optional unit B, kB/KB, MB, GB, TB
// (powers of 1000) or KiB, MiB, GiB, TiB (powers of 1024); nullopt when it does not parse.
std::optional<int64_t> parse_byte_size(std::string_view text);
// "1.50 GiB", "12.0 MiB", "512 B".
std::string format_bytes(size_t bytes);

// Where a layer's buffers come from: an Arena, or a region several layers share.
// Activations (what layers save for backward, their gradients, what TP collectives move)
// come from alloc_act in the run's activation dtype (bf16 under training.precision = "bf16");
// statistics that stay fp32 whatever the precision (norms' rstd, softmax's log-sum-exp, the
// loss) from alloc.
class Allocator {
 public:
  virtual ~Allocator() = default;
  virtual Tensor alloc(Shape shape, DType dtype = DType::f32) = 0;
  Tensor alloc_act(Shape shape) { return alloc(shape, act_dtype_); }
  DType act_dtype() const { return act_dtype_; }
  void set_act_dtype(DType dtype) { act_dtype_ = dtype; }

 private:
  DType act_dtype_ = DType::f32;
};

// Every allocation is rounded up to this, so that views stay aligned: for SIMD on the host, and
// on a GPU for the 128-bit loads of the kernels and the alignment cuBLASLt's fastest GEMM
// kernels ask of each operand (256 bytes, as cudaMalloc's own blocks).
inline constexpr size_t kAllocationAlignment = 256;
size_t aligned_size(size_t bytes);

// kAllocationAlignment-aligned, zero-initialised memory from a source (a backend's device
// memory, or host_memory() when none is given), released when the arena dies.
// `reserve_only`: plans a footprint without using memory. Each allocation takes address space
// that is never touched (its pages are never backed; it is reserved in chunks, arena.cpp), so
// code that lays out buffers runs unchanged and bytes() is exactly what a real arena would
// hold; MemoryStats is not told. Writing to such a buffer faults.
class Arena final : public Allocator {
 public:
  Arena(MemoryTag tag, MemorySource& source, bool reserve_only = false)
      : tag_(tag), source_(&source), reserve_only_(reserve_only) {}
  explicit Arena(MemoryTag tag, bool reserve_only = false);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;
  // The moved-from arena holds nothing, so that only one of the two un-counts the bytes.
  Arena(Arena&& other) noexcept
      : Allocator(other),
        tag_(other.tag_),
        source_(other.source_),
        reserve_only_(other.reserve_only_),
        bytes_(std::exchange(other.bytes_, 0)),
        blocks_(std::move(other.blocks_)),
        chunk_next_(std::exchange(other.chunk_next_, nullptr)),
        chunk_left_(std::exchange(other.chunk_left_, 0)) {}
  Arena& operator=(Arena&&) = delete;
  ~Arena() override;

  Tensor alloc(Shape shape, DType dtype = DType::f32) override;
  size_t bytes() const { return bytes_; }
  MemoryTag tag() const { return tag_; }
  bool reserve_only() const { return reserve_only_; }

 private:
  struct Release {
    MemorySource* source = nullptr;  // null: reserved address space
    size_t bytes = 0;
    void operator()(void* p) const;
  };
  void* reserve(size_t rounded);  // reserve_only: the next `rounded` bytes of address space
  MemoryTag tag_;
  MemorySource* source_ = nullptr;
  bool reserve_only_ = false;
  size_t bytes_ = 0;
  std::vector<std::unique_ptr<void, Release>> blocks_;
  // reserve_only: the unused end of the last chunk reserved.
  char* chunk_next_ = nullptr;
  size_t chunk_left_ = 0;
};

// Hands out consecutive aligned views of one region, from its start again after rewind():
// layers whose buffers are only live one at a time (a block recomputed in backward, a
// collective's scratch) share the region. Fails naming `what` when the region is too small.
class RegionAllocator final : public Allocator {
 public:
  RegionAllocator() = default;  // an empty region
  RegionAllocator(Tensor region, const char* what) : region_(region), what_(what) {}
  Tensor alloc(Shape shape, DType dtype = DType::f32) override;
  void rewind() { offset_ = 0; }
  size_t used() const { return offset_; }

 private:
  Tensor region_;
  const char* what_ = "";
  size_t offset_ = 0;
};

}  // namespace bottle
