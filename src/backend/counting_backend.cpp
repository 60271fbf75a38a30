#include "backend/counting_backend.h"

#include <sys/mman.h>

#include <algorithm>

#include "core/arena.h"
#include "core/error.h"

namespace bottle {

double GemmShape::bytes() const {
  const double mk = double(m) * double(k), kn = double(k) * double(n), mn = double(m) * double(n);
  return double(batch) * (mk * a_size + kn * b_size + mn * c_size * (accumulate ? 2 : 1));
}

double OpCounts::gemm_flops() const {
  double f = 0;
  for (const auto& [shape, calls] : gemms) f += shape.flops() * double(calls);
  return f;
}

double OpCounts::flops() const {
  double f = gemm_flops();
  for (const auto& [name, k] : kernels) f += k.flops;
  return f;
}

void OpCounts::add(const OpCounts& other) {
  for (const auto& [shape, calls] : other.gemms) gemms[shape] += calls;
  for (const auto& [name, k] : other.kernels) {
    KernelCount& mine = kernels[name];
    mine.calls += k.calls;
    mine.flops += k.flops;
    mine.bytes += k.bytes;
  }
}

void CountingBackend::around(const char* op, std::span<const Tensor> traffic, double flops,
                             const std::function<void()>&) {
  // The ops a device backend answers on the host wait for the device first.
  const std::string_view name = op;
  if (name == "to_host" || name == "first_outside" || name == "sum" || name == "sum_squares")
    ++host_waits_;
  double bytes = 0;
  for (const Tensor& t : traffic) bytes += double(t.nbytes());
  count([&](OpCounts& counts) {
    KernelCount& k = counts.kernels[op];
    ++k.calls;
    k.flops += flops;
    k.bytes += bytes;
  });
}

CountingBackend::~CountingBackend() {
  for (const Reservation& r : reservations_) munmap(r.base, r.bytes);
}

void* CountingBackend::allocate(size_t bytes, const char* what) {
  const size_t rounded = aligned_size(std::max<size_t>(bytes, 1));
  if (reservations_.empty() || reservations_.back().bytes - reservations_.back().used < rounded) {
    // Address space only (PROT_NONE, MAP_NORESERVE): 64 GiB at a time, or what one buffer needs
    // where a limit on the address space (ulimit -v) refuses that much.
    void* p = MAP_FAILED;
    size_t size = 0;
    for (size_t want : {std::max<size_t>(rounded, size_t(64) << 30), rounded}) {
      p = mmap(nullptr, want, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      size = want;
      if (p != MAP_FAILED) break;
    }
    BOTTLE_CHECK(p != MAP_FAILED, "cannot reserve {} of address space to plan the {}",
                 format_bytes(rounded), what);
    reservations_.push_back({static_cast<char*>(p), size, 0});
  }
  Reservation& r = reservations_.back();
  void* p = r.base + r.used;
  r.used += rounded;
  reserved_ += bytes;
  peak_reserved_ = std::max(peak_reserved_, reserved_);
  return p;
}

// The address space is returned when the backend dies: a dry run is short.
void CountingBackend::deallocate(void*, size_t bytes) { reserved_ -= bytes; }

void CountingBackend::do_gemm(const GemmArgs& a) {
  const GemmShape shape{a.m,
                        a.n,
                        a.k,
                        a.batch,
                        int(dtype_size(a.a_dtype)),
                        int(dtype_size(a.b_dtype)),
                        int(dtype_size(a.c_dtype)),
                        a.beta != 0.0f};
  count([&](OpCounts& counts) { ++counts.gemms[shape]; });
  if (gemm_scratch_source_)
    largest_gemm_scratch_ =
        std::max(largest_gemm_scratch_, gemm_scratch_source_->gemm_scratch_bytes(a));
}

}  // namespace bottle
