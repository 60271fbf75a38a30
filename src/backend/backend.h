#pragma once
// The kernel interface every layer calls. Layer code never knows which backend runs it:
// `cpu` (oneDNN GEMMs + OpenMP loops), `reference` (naive loops, used by tests as the
// oracle), `cuda` (kernels of src/backend/cuda, cuBLASLt GEMMs). Tensors carry their dtype; a backend
// rejects dtypes it lacks.
//
// The backend owns memory: arenas ask it for their blocks, and only backends read or write
// tensor data. Layers, the model and the trainer move data with copy / copy_columns, reduce
// with sum / sum_squares, and stage host data in and out with from_host / to_host
// (checkpoint I/O, the data loader, metrics, sampling), so a device backend runs them all.
//
// Conventions:
// - Row-major; "rows" are all leading dims flattened, "cols" the last dim.
// - Activation gradients are written, parameter gradients accumulated (docs/design.md §11).
//   A *_backward kernel WRITES each input gradient that it alone produces: silu_backward's dx,
//   swiglu_backward's dgate and dup, layernorm_backward's dx, attention_backward's dq, dk and
//   dv, the cross-entropies' dlogits. It ADDS into every parameter gradient (dweight, dbias,
//   dtable; a GEMM's C with beta = 1) and into the input gradients that have more than one
//   producer: rmsnorm_backward's and rmsnorm_shard_backward's dx (the residual stream's
//   gradient, where the norm's share joins the skip connection's). So no caller zero-fills a
//   buffer a kernel writes, and no kernel reads what it is about to overwrite.
// - Tensors passed as outputs of a forward kernel are overwritten.
#include <chrono>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/memory_source.h"
#include "core/tensor.h"

namespace bottle {

// C[i] = alpha * op(A[i]) * op(B[i]) + beta * C_in[i], i < batch, row-major.
// op(A) is m x k, op(B) is k x n, C is m x n. lda/ldb/ldc are row strides of the stored
// matrices (A stored k x m when trans_a); stride_* are batch strides, in elements.
// C_in is C itself unless c_in is given: then it is read there, laid out like C (ldc,
// stride_c, c_dtype), and C is only written. A residual add then rides in the GEMM's
// epilogue (y = u Bᵀ + x), rounded once with the product, instead of a kernel of its own.
// Each operand has its dtype: bf16 operands are multiplied exactly and summed in fp32, and a
// bf16 C receives the fp32 result rounded to nearest even (docs/design.md, mixed precision).
struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f, beta = 0.0f;
  const void* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  const void* c_in = nullptr;  // null: C_in is c
  int64_t batch = 1;
  DType a_dtype = DType::f32, b_dtype = DType::f32, c_dtype = DType::f32;
  // The operands' dtypes from the tensors they come from.
  void dtypes_of(const Tensor& a, const Tensor& b, const Tensor& c) {
    a_dtype = a.dtype, b_dtype = b.dtype, c_dtype = c.dtype;
  }
  bool any_bf16() const {
    return a_dtype == DType::bf16 || b_dtype == DType::bf16 || c_dtype == DType::bf16;
  }
  // Whether C_in is read from memory other than C.
  bool reads_other_c() const { return c_in != nullptr && c_in != c && beta != 0.0f; }
  const void* c_read() const { return c_in ? c_in : c; }
  // Item i of the batch as a GEMM of its own (batch 1), its operands offset by the strides
  // (0 for a broadcast operand): what a backend runs item by item where it has no batched
  // kernel for these strides.
  GemmArgs item(int64_t i) const;
};

// One rank's widest rows of each kind in a training step, for Backend::kernel_scratch_bytes: a
// backend whose kernels keep scratch per row or per thread sizes it from them.
struct KernelShapes {
  DType dtype = DType::f32;       // the activations' (training.precision)
  int64_t seq = 0, head_dim = 0;  // attention's sequence and head width
  int64_t rope_width = 0;         // one position's query heads (heads · head_dim): RoPE's row
  int64_t hidden = 0;             // the residual stream's row: the RMSNorms, embedding rows
  int64_t latent = 0;             // the widest latents a row op reads: a projection group's Σr
  int64_t latent_norm = 0;        // the latent LayerNorm's row (LaX's crossing); 0: none
  int64_t logits = 0;             // one rank's row of logits (its share of the vocabulary)
};

// A range [offset, offset + count) of a flat buffer, in elements.
struct ElementRange {
  int64_t offset = 0, count = 0;
  bool operator==(const ElementRange&) const = default;
};

// One range of a flat buffer whose squares add into out[slot] (sum_squares_ranges).
struct SumRange {
  int64_t offset = 0, count = 0;
  int slot = 0;
  bool operator==(const SumRange&) const = default;
};

struct AdamWArgs {
  float lr = 1e-3f, beta1 = 0.9f, beta2 = 0.95f, eps = 1e-8f, weight_decay = 0.0f;
  float grad_scale = 1.0f;  // applied to the gradient first, when no control tensor is given
  int64_t step = 1;         // 1-based, for bias correction
  // Ranges of the buffer (offsets from its start, ascending, disjoint) that take no weight
  // decay: norm weights. The rest decays by weight_decay.
  std::span<const ElementRange> no_decay;
};

// Muon's element-wise parts (train/muon.h) on one fp32 buffer, a matrix or many end to end.
struct MuonArgs {
  float momentum = 0.95f;
  bool nesterov = true;
  float grad_scale = 1.0f;  // applied to the gradient first, when no control tensor is given
  // muon_apply: param ← param · (1 − lr · weight_decay) − lr · adjust · update, where adjust
  // (0.2 · √max(m, n)) gives the orthogonalised update AdamW's RMS.
  float lr = 1e-3f, weight_decay = 0.0f, adjust = 1.0f;
};

// What clip_and_check writes into a step's control tensor (f32 [kStepControlSize]), which
// adamw_update, muon_momentum and muon_apply read on the device.
inline constexpr int kControlScale = 0;  // the gradient's factor (clipping)
inline constexpr int kControlApply = 1;  // 1: update; 0: a non-finite step, skipped
inline constexpr int kStepControlSize = 2;

class Backend : public MemorySource {
 public:
  ~Backend() override = default;
  virtual std::string_view name() const = 0;

  // --- bf16 (training.precision = "bf16"). Every kernel below takes bf16 tensors for its
  // activations where this is empty; else it is the reason the backend cannot.
  virtual std::string bf16_unsupported() const { return "it has no bf16 kernels"; }
  // How bf16 GEMMs run, for `bench step`, e.g. "oneDNN bf16 matmul (avx512_core_amx)".
  virtual std::string bf16_gemm_path() const { return "none"; }

  // --- Memory. device(), allocate() and deallocate() come from MemorySource: a backend is
  // the source of its device's memory.
  // The device stream this backend's kernels run on, as its native handle (a cudaStream_t for
  // cuda), so that a device communicator orders its own stream against it; null for the host
  // backends, whose kernels finish before they return.
  virtual void* native_stream() const { return nullptr; }
  // Waits until every kernel issued so far has finished: a device backend runs them
  // asynchronously (timings, MFU); a host backend's kernels finish before they return.
  virtual void synchronize() {}
  // How many times this backend has made the host wait for the device so far: stream
  // synchronisations and device-to-host copies (to_host, first_outside, sum, sum_squares). A
  // training step is allowed one (tests/train/test_step_syncs.cpp); the host backends never wait,
  // and the counting backend counts what a device backend would do.
  virtual int64_t host_waits() const { return 0; }
  // Points in the backend's stream of work, for a profile that must not wait after every op:
  // timing_mark() records one and returns its id; marks_elapsed_ms(from, to) is the time
  // between two marks, waiting for the later one; reset_marks() forgets them all. A device
  // backend records events on its stream; a host backend's ops finish before they return, so
  // its marks are wall-clock instants.
  virtual int64_t timing_mark() {
    host_marks_.push_back(std::chrono::steady_clock::now());
    return int64_t(host_marks_.size()) - 1;
  }
  virtual double marks_elapsed_ms(int64_t from, int64_t to) {
    return std::chrono::duration<double, std::milli>(host_marks_.at(size_t(to)) -
                                                     host_marks_.at(size_t(from)))
        .count();
  }
  virtual void reset_marks() { host_marks_.clear(); }
  // Named, nested ranges around parts of the work (a block's projection groups, its
  // recomputation), as NVTX ranges name them on a GPU timeline: a profiler attributes the ops
  // inside to them (ProfilingBackend::range_times). They change nothing that runs; the
  // backends that run ops ignore them. BackendRange below pushes and pops one.
  virtual void push_range(const char* name) { (void)name; }
  virtual void pop_range() {}
  // Bytes of the backend's device memory free now; 0 for the host backends, whose memory is
  // the machine's (train/memory_plan.h reads that).
  virtual size_t device_memory_free() { return 0; }
  // Which attention kernels run for q [batch, seq, heads, head_dim], k, v with kv_heads heads,
  // in `dtype`, and why: the line a run prints first ("cuDNN 9.19.0 SDPA (...)", "own kernels
  // (cuDNN not loadable: ...)"). A device backend prepares them here, so that slow one-time
  // work (cuDNN building its graphs) happens before the first step; the host backends have one.
  virtual std::string attention_path(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                     int64_t head_dim, DType dtype) {
    return "own CPU kernel";
  }
  // Workspace the same attention takes beyond the activations, for the memory plan: cuDNN's
  // backward's dP or dQ workspace (backend/attention_workspace.h), the cpu backend's per-thread
  // scores (and bf16 windows); 0 for a backend whose attention needs none.
  virtual int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads,
                                            int64_t kv_heads, int64_t head_dim, DType dtype) {
    return 0;
  }
  // Scratch the other kernels of a training step keep between calls, beyond their operands,
  // for the memory plan: the cpu backend's per-thread bf16 slabs (attention's among them) and
  // norm-gradient partials, sized by the step's widest rows (KernelShapes). GEMMs are apart
  // (gemm_scratch_bytes): their scratch depends on each product's shape.
  virtual int64_t kernel_scratch_bytes(const KernelShapes& shapes) { return 0; }
  // Scratch gemm(args) takes beyond its operands, for the memory plan: the cpu backend's fp32
  // copies of bf16 operands where oneDNN has no matmul for them on this CPU; 0 where the
  // product runs as it is.
  virtual int64_t gemm_scratch_bytes(const GemmArgs& args) { return 0; }
  // Frees the scratch kernels keep between calls (it grows again as they need it), so that
  // what a one-off call took (the GEMM peak's probe of products larger than a step's) is not
  // held while training. Only between ops.
  virtual void release_scratch() {}

  // --- The ops (backend/backend_ops.def, one entry each, with its contract). Each checks its
  // operands once for every backend (backend.cpp) and then calls its implementation, do_<op>.
#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic) ret op params;
#include "backend/backend_ops.def"

 protected:
  // The implementations, called once the public op has checked its operands (backend.cpp):
  // shapes, dtypes, that every tensor lives where this backend computes. An implementation
  // checks only what is its own (a dtype it lacks, a limit of its kernels).
#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic) virtual ret do_##op params = 0;
#include "backend/backend_ops.def"

 private:
  std::vector<std::chrono::steady_clock::time_point> host_marks_;  // timing_mark's, host backends
};

// A range of Backend::push_range for the scope; a null name opens none.
class BackendRange {
 public:
  BackendRange(Backend& be, const char* name) : be_(name ? &be : nullptr) {
    if (be_) be_->push_range(name);
  }
  ~BackendRange() {
    if (be_) be_->pop_range();
  }
  BackendRange(const BackendRange&) = delete;
  BackendRange& operator=(const BackendRange&) = delete;

 private:
  Backend* be_;
};

// "cpu", "reference" or "cuda" (when compiled in and a GPU is visible). cpu's kernels take bf16
// tensors themselves; the reference comes wrapped to take them (backend/widening_backend.h), and
// so does "cpu-widened", the cpu kernels behind that wrapper: a fallback to name, and the bits
// the native bf16 kernels are tested against.
std::unique_ptr<Backend> make_backend(std::string_view name);
// Why make_backend(name) would fail on this machine ("no CUDA device is visible", "this build
// has no CUDA backend ..."), or empty when it would not: GPU tests skip with this reason.
std::string backend_unavailable(std::string_view name);
// The process's host-memory backend ("cpu"): arenas that are not given a backend (host
// workspaces, tests, tools) allocate from it. A device run passes its backend explicitly.
Backend& host_backend();
// The backends compiled in, one line each with the library behind it, e.g.
// "cpu: oneDNN 2.6.3 GEMMs + OpenMP" (for `bottle --version`).
std::vector<std::string> backend_names();

}  // namespace bottle
