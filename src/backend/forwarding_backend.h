#pragma once
// A backend that hands every op to another backend (`inner`) through one hook, around(), so
// that a wrapper overrides the hook and only the ops it changes: the profiler times the hook,
// the counting backend of `bottle plan` counts it and runs nothing, the widening backend
// overrides the ops that take bf16. The forwarders come from the list of ops
// (backend/backend_ops.def), whose entries give the tensors each op moves (its traffic) and, for
// attention, its FLOPs, written once for every wrapper.
//
// Traffic: every tensor the op reads, and once more every tensor it also writes after reading
// it (a backward kernel that adds into its gradient). Where an op touches part of a tensor,
// the part: an embedding reads one table row per token (the output's size), a column copy its
// columns, sum_squares_ranges its ranges.
#include <algorithm>
#include <array>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <type_traits>

#include "backend/backend.h"

namespace bottle {

// What one op moves (above), as an entry of backend/backend_ops.def writes it: moves(tensors...),
// with .flops(f) where the op is not memory-bound (attention; GEMMs pass none, their wrappers
// see GemmArgs) and .counted_as(name) where wrappers count it under a name of its own.
class Traffic {
 public:
  static constexpr size_t kMaxTensors = 10;
  Traffic(std::initializer_list<Tensor> tensors) : count_(tensors.size()) {
    BOTTLE_ASSERT(count_ <= kMaxTensors, "an op moving {} tensors (at most {})", count_,
                  kMaxTensors);
    std::copy(tensors.begin(), tensors.end(), tensors_.begin());
  }
  Traffic flops(double f) const {
    Traffic t = *this;
    t.cost = f;
    return t;
  }
  Traffic counted_as(const char* name) const {
    Traffic t = *this;
    t.kernel = name;
    return t;
  }
  std::span<const Tensor> tensors() const { return {tensors_.data(), count_}; }

  double cost = 0.0;             // FLOPs
  const char* kernel = nullptr;  // null: the op's name

 private:
  std::array<Tensor, kMaxTensors> tensors_{};
  size_t count_;
};

template <typename... Tensors>
Traffic moves(const Tensors&... tensors) {
  return Traffic(std::initializer_list<Tensor>{Tensor(tensors)...});
}

class ForwardingBackend : public Backend {
 public:
  // inner may be null for a backend that runs nothing (the counting backend), which then
  // overrides the memory operations and never calls run in around().
  explicit ForwardingBackend(std::unique_ptr<Backend> inner) : inner_(std::move(inner)) {}

  Backend& inner() const {
    BOTTLE_ASSERT(inner_ != nullptr, "{}: no inner backend to run an op on", name());
    return *inner_;
  }

  // What is not an op: the inner backend's.
  std::string_view name() const override { return inner().name(); }
  std::string bf16_unsupported() const override { return inner().bf16_unsupported(); }
  std::string bf16_gemm_path() const override { return inner().bf16_gemm_path(); }
  Device device() const override { return inner().device(); }
  void* native_stream() const override { return inner().native_stream(); }
  void synchronize() override { inner().synchronize(); }
  int64_t host_waits() const override { return inner().host_waits(); }
  int64_t timing_mark() override { return inner().timing_mark(); }
  double marks_elapsed_ms(int64_t from, int64_t to) override {
    return inner().marks_elapsed_ms(from, to);
  }
  void reset_marks() override { inner().reset_marks(); }
  void push_range(const char* name) override {
    if (inner_) inner_->push_range(name);
  }
  void pop_range() override {
    if (inner_) inner_->pop_range();
  }
  size_t device_memory_free() override { return inner().device_memory_free(); }
  void* allocate(size_t bytes, const char* what) override { return inner().allocate(bytes, what); }
  void deallocate(void* p, size_t bytes) override { inner().deallocate(p, bytes); }
  std::string attention_path(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, DType dtype) override {
    return inner().attention_path(batch, seq, heads, kv_heads, head_dim, dtype);
  }
  int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, DType dtype) override {
    return inner().attention_workspace_bytes(batch, seq, heads, kv_heads, head_dim, dtype);
  }
  int64_t kernel_scratch_bytes(const KernelShapes& shapes) override {
    return inner().kernel_scratch_bytes(shapes);
  }
  int64_t gemm_scratch_bytes(const GemmArgs& args) override {
    return inner().gemm_scratch_bytes(args);
  }
  void release_scratch() override { inner().release_scratch(); }

  // The ops, each through around() with the traffic its entry of backend/backend_ops.def gives.
#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic) ret do_##op params override;
#include "backend/backend_ops.def"

 protected:
  // Runs one op: `run` calls the inner backend's. `op` names it (GEMMs: "gemm"), `traffic`
  // lists the tensors it moves (above) and `flops` its arithmetic where it is not memory-bound
  // (attention; GEMMs pass 0, their wrappers see GemmArgs).
  virtual void around(const char* op, std::span<const Tensor> traffic, double flops,
                      const std::function<void()>& run) {
    (void)op, (void)traffic, (void)flops;
    run();
  }

 private:
  // An op's forwarder (generated from its entry): around() with the op's traffic, returning
  // what the inner backend's op returned, or not_run<R>() where around() did not run it.
  template <typename R, typename Run>
  R forward(const char* op, const Traffic& traffic, Run&& run) {
    const char* kernel = traffic.kernel ? traffic.kernel : op;
    if constexpr (std::is_void_v<R>) {
      around(kernel, traffic.tensors(), traffic.cost, run);
    } else {
      R result = not_run<R>();
      around(kernel, traffic.tensors(), traffic.cost, [&] { result = run(); });
      return result;
    }
  }
  // What an op returns where nothing ran it (the counting backend): what a run would return
  // without data, no id outside the range (first_outside, the only op returning an index) and
  // a sum of zero (the reductions). A new return type must say its own.
  template <typename R>
  static R not_run();

  std::unique_ptr<Backend> inner_;
};

// QKᵀ and PV over the causal triangle of q [B, S, H, hd]: 2 · 2·hd FLOPs per (query head, i,
// j ≤ i), the count `bottle plan` prices and MFU uses.
double causal_attention_flops(const Tensor& q);

}  // namespace bottle
