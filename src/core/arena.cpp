#include "core/arena.h"

#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
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

void MemoryStats::reset_peaks() {
  peak_ = live_;
  peak_total_ = live_total();
}

size_t MemoryStats::live_total() const {
  return std::accumulate(live_.begin(), live_.end(), size_t(0));
}

size_t MemoryBreakdown::total() const {
  return std::accumulate(bytes.begin(), bytes.end(), size_t(0));
}

std::optional<int64_t> parse_byte_size(std::string_view text) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    while (!s.empty() && s.back() == ' ') s.remove_suffix(1);
    return s;
  };
  text = trim(text);
  size_t digits = 0;
  while (digits < text.size() && (std::isdigit(uint8_t(text[digits])) || text[digits] == '.'))
    ++digits;
  if (digits == 0) return std::nullopt;
  const std::string number(text.substr(0, digits));
  char* end = nullptr;
  const double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size()) return std::nullopt;
  const std::string_view unit = trim(text.substr(digits));
  static constexpr std::pair<std::string_view, double> kUnits[] = {{"", 1},
                                                                   {"B", 1},
                                                                   {"kB", 1e3},
                                                                   {"KB", 1e3},
                                                                   {"MB", 1e6},
                                                                   {"GB", 1e9},
                                                                   {"TB", 1e12},
                                                                   {"KiB", 1024.0},
                                                                   {"MiB", 1 << 20},
                                                                   {"GiB", double(1 << 30)},
                                                                   {"TiB", 1099511627776.0}};
  for (const auto& [name, scale] : kUnits)
    if (unit == name) {
      const double bytes = value * scale;
      if (!(bytes < 9.2e18) || ((unit.empty() || unit == "B") && bytes != std::floor(bytes)))
        return std::nullopt;
      return int64_t(bytes);
    }
  return std::nullopt;
}

std::string format_bytes(size_t bytes) {
  const double b = double(bytes);
  if (b >= double(1 << 30)) return fmt::format("{:.2f} GiB", b / double(1 << 30));
  if (b >= double(1 << 20)) return fmt::format("{:.1f} MiB", b / double(1 << 20));
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

size_t aligned_size(size_t bytes) {
  return (std::max<size_t>(bytes, 1) + kAllocationAlignment - 1) / kAllocationAlignment *
         kAllocationAlignment;
}

void Arena::Release::operator()(void* p) const {
  if (source)
    source->deallocate(p, bytes);
  else
    munmap(p, bytes);
}

Arena::Arena(MemoryTag tag, bool reserve_only) : Arena(tag, host_memory(), reserve_only) {}

Arena::~Arena() {
  if (bytes_ && !reserve_only_) MemoryStats::global().sub(tag_, bytes_);
}

// Address space for a reserve-only arena: PROT_NONE and MAP_NORESERVE commit no memory. It is
// reserved in chunks that grow with the arena (one system call per chunk, not per buffer: a
// plan of a large model's activations was mostly mmap and munmap). When the next buffer does
// not fit the chunk, the chunk's unused end goes back first, and where a limit on the address
// space (ulimit -v) refuses a chunk, the buffer's own size is tried: beyond its buffers an
// arena holds only the rest of its current chunk.
void* Arena::reserve(size_t rounded) {
  if (rounded > chunk_left_) {
    if (chunk_left_ > 0) {
      Release& last = blocks_.back().get_deleter();
      const size_t page = size_t(sysconf(_SC_PAGESIZE));
      const size_t used = (last.bytes - chunk_left_ + page - 1) / page * page;
      if (used < last.bytes) {
        munmap(static_cast<char*>(blocks_.back().get()) + used, last.bytes - used);
        last.bytes = used;
      }
    }
    constexpr size_t kFirstChunk = size_t(64) << 20, kLargestChunk = size_t(64) << 30;
    const size_t chunk = std::max(rounded, std::clamp(bytes_, kFirstChunk, kLargestChunk));
    void* p = MAP_FAILED;
    size_t size = 0;
    for (const size_t want : {chunk, rounded}) {
      p = mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      size = want;
      if (p != MAP_FAILED) break;
    }
    if (p == MAP_FAILED) {
      // Planning reserves the whole footprint as address space: where that fails, the
      // process's address-space limit (ulimit -v) is the usual reason, so name it.
      rlimit limit{};
      const bool limited = getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
      fail("cannot reserve {} of address space to plan the {}{}", format_bytes(rounded),
           memory_tag_name(tag_),
           limited ? fmt::format(": the process's address space is limited to {} (ulimit -v)",
                                 format_bytes(size_t(limit.rlim_cur)))
                   : std::string());
    }
    blocks_.emplace_back(p, Release{nullptr, size});
    chunk_next_ = static_cast<char*>(p);
    chunk_left_ = size;
  }
  void* p = chunk_next_;
  chunk_next_ += rounded;
  chunk_left_ -= rounded;
  return p;
}

Tensor Arena::alloc(Shape shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t rounded = aligned_size(t.nbytes());
  void* p = nullptr;
  if (reserve_only_) {
    p = reserve(rounded);
  } else {
    p = source_->allocate(rounded, memory_tag_name(tag_));
    MemoryStats::global().add(tag_, rounded);
    blocks_.emplace_back(p, Release{source_, rounded});
  }
  bytes_ += rounded;
  t.data = p;
  t.device = source_->device();
  return t;
}

Tensor RegionAllocator::alloc(Shape shape, DType dtype) {
  Tensor t;
  t.shape = shape;
  t.dtype = dtype;
  const size_t rounded = aligned_size(t.nbytes());
  BOTTLE_ASSERT(offset_ + rounded <= region_.nbytes(),
                "{}: the shared region of {} bytes is too small for {} more bytes at {}", what_,
                region_.nbytes(), rounded, offset_);
  t.data = static_cast<char*>(region_.data) + offset_;
  t.device = region_.device;
  offset_ += rounded;
  return t;
}

}  // namespace bottle
