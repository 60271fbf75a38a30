// The cuda backend's host side: device selection, the checks every op makes before it launches
// (shapes, dtypes, that each tensor lives on this GPU), the GEMMs' operands, and the launches of
// the kernels of src/backend/cuda/*.cu. Its parts: cuBLASLt behind one call (gemm_lt.h), memory,
// uploaded tables and pinned staging (device_memory.h), the choice of attention kernels
// (attention_router.h). Compiled
// by the host compiler; only the kernels are nvcc's.
#include "backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <tuple>
#include <vector>

#include "backend/attention_workspace.h"
#include "backend/cuda/attention_cudnn.h"
#include "backend/cuda/attention_router.h"
#include "backend/cuda/check.h"
#include "backend/cuda/device_memory.h"
#include "backend/cuda/gemm_lt.h"
#include "backend/cuda/growing_buffer.h"
#include "backend/cuda/kernels.h"
#include "core/arena.h"
#include "core/kernel_math.h"

namespace bottle {
namespace {

using cuda::check_cuda;

int local_rank() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend(AttentionChoice attention, cuda::CudnnLoader load_cudnn) {
    if (std::string why = cuda_unavailable(); !why.empty()) fail("cuda backend: {}", why);
    int devices = 0;
    check_cuda(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
    device_ = local_rank() % devices;
    check_cuda(cudaSetDevice(device_), "cudaSetDevice");
    check_cuda(cudaDeviceGetAttribute(&sm_major_, cudaDevAttrComputeCapabilityMajor, device_),
               "cudaDeviceGetAttribute");
    check_cuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    device_memory_ = {stream_, device_, &host_waits_};
    gemm_.emplace();  // on the device just chosen
    check_cuda(cudaMalloc(&reduce_partials_, sizeof(double) * cuda::reduce_partials_count() + 16),
               "cudaMalloc (reduction partials)");
    check_cuda(cudaMallocHost(&pinned_, kPinnedBytes), "cudaMallocHost");
    sync_each_op_ = std::getenv("BOTTLE_CUDA_SYNC") != nullptr;
    // cuDNN is opened unless the run asked for the own kernels; where it cannot be, the own
    // kernels run (auto) or make_cuda_backend stops the run (cudnn), saying why.
    attention_.emplace(attention, load_cudnn, stream_, sm_major_);
  }

  ~CudaBackend() override {
    cudaStreamSynchronize(stream_);
    if (attention_) attention_->close();  // cuDNN's handle is bound to the stream
    for (cudaEvent_t e : marks_) cudaEventDestroy(e);
    staging_.reset();
    range_table_.clear(device_memory_);
    gap_table_.clear(device_memory_);
    rope_table_.clear(device_memory_);
    scratch_.clear(device_memory_);
    cudaFree(reduce_partials_);
    cudaFreeHost(pinned_);
    gemm_.reset();
    cudaStreamDestroy(stream_);
  }

  // Why attention "cudnn" cannot be honoured here; empty when it can, or under another choice.
  std::string cudnn_refusal() const { return attention_->refusal(); }

  std::string_view name() const override { return "cuda"; }
  std::string bf16_unsupported() const override { return {}; }
  std::string bf16_gemm_path() const override {
    return "cuBLASLt bf16 tensor cores, fp32 accumulation";
  }
  Device device() const override { return Device::cuda; }
  void* native_stream() const override { return stream_; }
  void synchronize() override { sync("synchronize"); }
  int64_t host_waits() const override { return host_waits_; }

  // Timing marks are events on the compute stream, kept in a pool that reset_marks() returns
  // for reuse: a profile records two per op and reads them after the step.
  int64_t timing_mark() override {
    if (marks_used_ == marks_.size()) {
      cudaEvent_t e = nullptr;
      check_cuda(cudaEventCreateWithFlags(&e, cudaEventDefault), "cudaEventCreate (timing mark)");
      marks_.push_back(e);
    }
    check_cuda(cudaEventRecord(marks_[marks_used_], stream_), "cudaEventRecord (timing mark)");
    return int64_t(marks_used_++);
  }
  double marks_elapsed_ms(int64_t from, int64_t to) override {
    BOTTLE_CHECK(from >= 0 && to >= 0 && size_t(from) < marks_used_ && size_t(to) < marks_used_,
                 "cuda backend: timing marks {} and {} of {}", from, to, marks_used_);
    check_cuda(cudaEventSynchronize(marks_[size_t(to)]), "cudaEventSynchronize (timing mark)");
    float ms = 0.0f;
    check_cuda(cudaEventElapsedTime(&ms, marks_[size_t(from)], marks_[size_t(to)]),
               "cudaEventElapsedTime");
    return double(ms);
  }
  void reset_marks() override { marks_used_ = 0; }
  size_t device_memory_free() override {
    size_t free = 0, total = 0;
    check_cuda(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
    return free;
  }

  // --- Memory.
  void* allocate(size_t bytes, const char* what) override {
    const size_t rounded = aligned_size(bytes);
    void* p = device_memory_.try_allocate(rounded);
    if (!p) device_memory_.fail(rounded, what);
    check_cuda(cudaMemsetAsync(p, 0, rounded, stream_), "cudaMemset");
    return p;
  }
  void deallocate(void* p, size_t) override { device_memory_.release(p); }

  void do_to_host(void* dst, Tensor src) override {
    if (!src.nbytes()) return;
    check_cuda(cudaMemcpyAsync(dst, src.data, src.nbytes(), cudaMemcpyDeviceToHost, stream_),
               "to_host");
    sync("to_host");
  }
  void do_from_host(Tensor dst, const void* src) override {
    if (!dst.nbytes()) return;
    // The caller may free or reuse `src` as soon as this returns. A small transfer (a batch
    // of token ids) is copied into a slot of pinned staging memory and travels from there
    // while the host goes on; the slot is reused once its own copy has completed, which by
    // then it almost always has. A large one (checkpoints) waits.
    if (dst.nbytes() <= cuda::PinnedStaging::kSlotBytes) {
      if (!staging_) staging_ = std::make_unique<cuda::PinnedStaging>();
      staging_->copy(dst.data, src, dst.nbytes(), stream_, &host_waits_);
      return;
    }
    check_cuda(cudaMemcpyAsync(dst.data, src, dst.nbytes(), cudaMemcpyHostToDevice, stream_),
               "from_host");
    sync("from_host");
  }

  void do_copy(Tensor dst, Tensor src) override {
    BOTTLE_CHECK(dst.numel() == src.numel(),
                 "cuda backend: copy of {} elements {} into {} elements {}", src.numel(),
                 src.shape.str(), dst.numel(), dst.shape.str());
    if (!dst.numel()) return;
    if (dst.dtype == src.dtype) {
      check_cuda(
          cudaMemcpyAsync(dst.data, src.data, dst.nbytes(), cudaMemcpyDeviceToDevice, stream_),
          "copy");
    } else if (dst.dtype == DType::f64 || src.dtype == DType::f64) {
      // Device scalars to and from the f32 a communicator reduces.
      BOTTLE_CHECK(dst.dtype == DType::f32 || src.dtype == DType::f32,
                   "cuda backend: copy of {} into {}", dtype_name(src.dtype),
                   dtype_name(dst.dtype));
      cuda::convert_scalars(stream_, dst.data, dst.dtype, src.data, src.dtype, dst.numel());
    } else {
      cuda::convert(stream_, arr(dst), carr(src), dst.numel());
    }
    launched("copy");
  }

  void do_copy_columns(Tensor dst, int64_t dst_col, Tensor src, int64_t src_col,
                       int64_t cols) override {
    BOTTLE_CHECK(dst.rows() == src.rows() && cols >= 0 && dst_col >= 0 && src_col >= 0 &&
                     dst_col + cols <= dst.cols() && src_col + cols <= src.cols(),
                 "cuda backend: copy_columns of {} columns from column {} of {} {} into column "
                 "{} of {} {}",
                 cols, src_col, dtype_name(src.dtype), src.shape.str(), dst_col,
                 dtype_name(dst.dtype), dst.shape.str());
    if (!cols || !dst.rows()) return;
    if (dst.dtype == src.dtype) {
      const size_t e = dtype_size(dst.dtype);
      check_cuda(cudaMemcpy2DAsync(dst.at(dst_col), dst.cols() * e, src.at(src_col), src.cols() * e,
                                   cols * e, dst.rows(), cudaMemcpyDeviceToDevice, stream_),
                 "copy_columns");
    } else {
      cuda::convert_columns(stream_, arr(dst), dst.cols(), dst_col, carr(src), src.cols(), src_col,
                            dst.rows(), cols);
    }
    launched("copy_columns");
  }

  int64_t do_first_outside(Tensor ids, int64_t lo, int64_t hi) override {
    const int64_t n = ids.numel();
    if (!n) return -1;
    auto* result = static_cast<unsigned long long*>(reduce_partials_);
    const unsigned long long none = n;
    check_cuda(cudaMemcpyAsync(result, &none, sizeof none, cudaMemcpyHostToDevice, stream_),
               "first_outside");
    cuda::first_outside(stream_, static_cast<const int32_t*>(ids.data), n, lo, hi, result);
    launched("first_outside");
    unsigned long long found = 0;
    check_cuda(cudaMemcpyAsync(pinned_, result, sizeof found, cudaMemcpyDeviceToHost, stream_),
               "first_outside");
    sync("first_outside");
    std::memcpy(&found, pinned_, sizeof found);
    return found == none ? -1 : int64_t(found);
  }

  // --- GEMM, on cuBLASLt (gemm_lt.h), which takes f32 × f32 → f32 and bf16 × bf16 → bf16 or
  // f32 with fp32 compute; another mix (an f32 operand against a bf16 one) is widened to f32
  // first, exactly.
  void do_gemm(const GemmArgs& g) override {
    BOTTLE_CHECK(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1,
                 "cuda backend: gemm with m {} n {} k {} batch {}", g.m, g.n, g.k, g.batch);
    if (!g.m || !g.n) return;
    const bool native =
        (g.a_dtype == g.b_dtype) && (g.a_dtype == DType::bf16 || g.c_dtype == DType::f32);
    if (!g.k) return scale_c(g);  // cuBLASLt wants k >= 1, widened or not
    if (!native) return gemm_widened(g);
    gemm_->run(g, stream_);
    launched("gemm");
  }

  // --- Layer kernels.
  // Token ids are checked on the host, where a batch is read (train/trainer.cpp, eval): a
  // check here would make the host wait for the device at every embedding. The kernels never
  // read outside the table: an id outside it embeds as a zero row and adds to no row.
  void do_embedding_forward(Tensor out, Tensor tokens, Tensor table) override {
    embedding_shard_forward(out, tokens, table, 0);
  }
  void do_embedding_backward(Tensor dtable, Tensor tokens, Tensor dout) override {
    embedding_shard_backward(dtable, tokens, dout, 0);
  }
  void do_embedding_shard_forward(Tensor out, Tensor tokens, Tensor table, int64_t first) override {
    const char* k = "embedding_forward";
    cuda::embedding_forward(stream_, arr(out), ids(tokens), tokens.numel(), carr(table),
                            table.rows(), table.cols(), first);
    launched(k);
  }
  void do_embedding_shard_backward(Tensor dtable, Tensor tokens, Tensor dout,
                                   int64_t first) override {
    const char* k = "embedding_backward";
    cuda::embedding_backward(stream_, arr(dtable), ids(tokens), tokens.numel(), carr(dout),
                             dtable.rows(), dtable.cols(), first);
    launched(k);
  }

  void do_rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor weight, float eps) override {
    norm_forward("rmsnorm_forward", out, rstd, Tensor{}, x, weight, eps);
  }
  void do_residual_rmsnorm_forward(Tensor sum, Tensor out, Tensor rstd, Tensor x, Tensor residual,
                                   Tensor weight, float eps) override {
    cuda::residual_rmsnorm_forward(stream_, arr(sum), arr(out), arr(rstd), carr(x), carr(residual),
                                   carr(weight), x.rows(), x.cols(), eps);
    launched("residual_rmsnorm_forward");
  }
  void do_rmsnorm_shard_forward(Tensor out, Tensor sumsq, Tensor x, Tensor weight,
                                float eps) override {
    norm_forward("rmsnorm_shard_forward", out, Tensor{}, sumsq, x, weight, eps);
  }
  void do_rmsnorm_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                           Tensor rstd) override {
    norm_backward("rmsnorm_backward", dx, dweight, dout, x, weight, rstd, Tensor{}, x.cols());
  }
  void do_rmsnorm_shard_backward(Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                                 Tensor rstd, Tensor dot, int64_t d) override {
    norm_backward("rmsnorm_shard_backward", dx, dweight, dout, x, weight, rstd, dot, d);
  }

  void do_layernorm_forward(Tensor out, Tensor mean, Tensor rstd, Tensor x, Tensor weight,
                            Tensor bias, float eps) override {
    const char* k = "layernorm_forward";
    const int64_t n = x.rows(), c = x.cols();
    cuda::layernorm_forward(stream_, arr(out), arr(mean), arr(rstd), carr(x), carr(weight),
                            carr(bias), n, c, eps);
    launched(k);
  }
  void do_layernorm_backward(Tensor dx, Tensor dweight, Tensor dbias, Tensor dout, Tensor x,
                             Tensor weight, Tensor mean, Tensor rstd) override {
    const char* k = "layernorm_backward";
    const int64_t n = x.rows(), c = x.cols();
    cuda::layernorm_backward(stream_, arr(dx), arr(dweight), arr(dbias), carr(dout), carr(x),
                             carr(weight), carr(mean), carr(rstd), n, c, norm_scratch(n, c, k));
    launched(k);
  }

  void do_rope_forward(Tensor q, Tensor k, float theta) override {
    rope("rope_forward", q, k, theta, 1.0f);
  }
  void do_rope_backward(Tensor dq, Tensor dk, float theta) override {
    rope("rope_backward", dq, dk, theta, -1.0f);
  }

  void do_attention_forward(Tensor out, Tensor lse, Tensor q, Tensor k, Tensor v) override {
    const char* name = "attention_forward";
    const cuda::SdpaShape s = attention_shape(name, q, k, v);
    if (const std::optional<cuda::SdpaShape> c = attention_->route(name, s, lse, {out, q, k, v})) {
      cuda::CudnnAttention& cudnn = attention_->cudnn();
      void* workspace = scratch(cudnn.forward_workspace_bytes(*c), "cuDNN attention workspace");
      cudnn.forward(out.data, lse.f32(), q.data, k.data, v.data, *c, workspace);
      launched(name);
      return;
    }
    cuda::attention_forward(stream_, arr(out), arr(lse), carr(q), carr(k), carr(v), s.batch, s.seq,
                            s.heads, s.kv_heads, s.head_dim);
    launched(name);
  }
  void do_attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor dout, Tensor out, Tensor lse,
                             Tensor q, Tensor k, Tensor v) override {
    const char* name = "attention_backward";
    const cuda::SdpaShape s = attention_shape(name, q, k, v);
    if (const std::optional<cuda::SdpaShape> c =
            attention_->route(name, s, lse, {dout, out, q, k, v})) {
      cuda::CudnnAttention& cudnn = attention_->cudnn();
      // cuDNN writes its gradients, as bottle's backward kernels do (backend.h): straight into
      // dq, dk, dv when they are bf16 (a bf16 run's activation gradients), else into bf16
      // scratch converted into them. Each scratch part starts on 256 bytes, as cudaMalloc's
      // own blocks do.
      const size_t workspace_bytes = cudnn.backward_workspace_bytes(*c);
      const bool direct =
          dq.dtype == DType::bf16 && dk.dtype == DType::bf16 && dv.dtype == DType::bf16;
      if (direct) {
        void* workspace =
            workspace_bytes ? scratch(workspace_bytes, "cuDNN attention workspace") : nullptr;
        cudnn.backward(dq.data, dk.data, dv.data, dout.data, out.data, lse.f32(), q.data, k.data,
                       v.data, *c, workspace);
        launched(name);
        return;
      }
      const auto align = [](size_t bytes) { return (bytes + 255) & ~size_t(255); };
      const size_t q_bytes = align(2 * size_t(q.numel())), kv_bytes = align(2 * size_t(k.numel()));
      char* base = static_cast<char*>(
          scratch(q_bytes + 2 * kv_bytes + workspace_bytes, "cuDNN attention gradients"));
      void* dq_s = base;                       // [B, S, H, hd] bf16
      void* dk_s = base + q_bytes;             // [B, S, Hkv, hd] bf16
      void* dv_s = base + q_bytes + kv_bytes;  // [B, S, Hkv, hd] bf16
      void* workspace = base + q_bytes + 2 * kv_bytes;
      cudnn.backward(dq_s, dk_s, dv_s, dout.data, out.data, lse.f32(), q.data, k.data, v.data, *c,
                     workspace_bytes ? workspace : nullptr);
      cuda::convert(stream_, arr(dq), {dq_s, DType::bf16}, dq.numel());
      cuda::convert(stream_, arr(dk), {dk_s, DType::bf16}, dk.numel());
      cuda::convert(stream_, arr(dv), {dv_s, DType::bf16}, dv.numel());
      launched(name);
      return;
    }
    void* scratch = this->scratch(
        cuda::attention_backward_scratch_bytes(s.batch, s.seq, s.heads, s.kv_heads, s.head_dim),
        "attention scratch");
    cuda::attention_backward(stream_, arr(dq), arr(dk), arr(dv), carr(dout), carr(out), carr(lse),
                             carr(q), carr(k), carr(v), s.batch, s.seq, s.heads, s.kv_heads,
                             s.head_dim, scratch);
    launched(name);
  }

  std::string attention_path(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                             int64_t head_dim, DType dtype) override {
    return attention_->path({batch, seq, heads, kv_heads, head_dim}, dtype);
  }
  int64_t attention_workspace_bytes(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads,
                                    int64_t head_dim, DType dtype) override {
    return attention_->workspace_bytes({batch, seq, heads, kv_heads, head_dim}, dtype);
  }

  void do_silu_forward(Tensor out, Tensor x) override {
    cuda::silu_forward(stream_, arr(out), carr(x), x.numel());
    launched("silu_forward");
  }
  void do_silu_backward(Tensor dx, Tensor dout, Tensor x) override {
    cuda::silu_backward(stream_, arr(dx), carr(dout), carr(x), x.numel());
    launched("silu_backward");
  }
  void do_swiglu_forward(Tensor out, Tensor gate, Tensor up, bool gate_act) override {
    cuda::swiglu_forward(stream_, arr(out), carr(gate), carr(up), gate.numel(), gate_act);
    launched("swiglu_forward");
  }
  void do_swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up,
                          bool gate_act) override {
    cuda::swiglu_backward(stream_, arr(dgate), arr(dup), carr(dout), carr(gate), carr(up),
                          gate.numel(), gate_act);
    launched("swiglu_backward");
  }

  void do_add(Tensor out, Tensor a, Tensor b) override {
    cuda::add(stream_, arr(out), carr(a), carr(b), out.numel());
    launched("add");
  }
  void do_accumulate(Tensor dst, Tensor src) override {
    cuda::accumulate(stream_, arr(dst), carr(src), dst.numel());
    launched("accumulate");
  }
  void do_fill_zero(Tensor x) override {
    if (x.nbytes()) check_cuda(cudaMemsetAsync(x.data, 0, x.nbytes(), stream_), "fill_zero");
  }
  void do_scale(Tensor x, float factor) override {
    cuda::scale(stream_, arr(x), factor, x.numel());
    launched("scale");
  }
  double do_sum_squares(Tensor x) override { return reduce("sum_squares", x, true); }
  double do_sum(Tensor x) override { return reduce("sum", x, false); }
  void do_multiply(Tensor out, Tensor a, Tensor b) override {
    cuda::multiply(stream_, arr(out), carr(a), carr(b), out.numel());
    launched("multiply");
  }
  void do_divide(Tensor out, Tensor a, Tensor b) override {
    cuda::divide(stream_, arr(out), carr(a), carr(b), out.numel());
    launched("divide");
  }
  void do_rms_from_sum_squares(Tensor out, Tensor sumsq, float count, float eps,
                               bool reciprocal) override {
    cuda::rms_from_sum_squares(stream_, arr(out), carr(sumsq), out.numel(), count, eps, reciprocal);
    launched("rms_from_sum_squares");
  }

  void do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                Tensor targets) override {
    const char* k = "cross_entropy_forward";
    const int64_t n = logits.rows(), v = logits.cols();
    // Targets are checked on the host as tokens are; one outside the row gives a NaN loss.
    cuda::cross_entropy_forward(stream_, arr(losses), arr(probs), carr(logits), ids(targets), n, v);
    launched(k);
  }
  void do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                 float scale) override {
    const char* k = "cross_entropy_backward";
    const int64_t n = probs.rows(), v = probs.cols();
    cuda::cross_entropy_backward(stream_, arr(dlogits), carr(probs), ids(targets), n, v, scale);
    launched(k);
  }

  void do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) override {
    const char* k = "logits_row_stats";
    cuda::logits_row_stats(stream_, arr(max), arr(sumexp), carr(logits), logits.rows(),
                           logits.cols());
    launched(k);
  }
  void do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max, Tensor sumexp,
                                       Tensor targets, int64_t first, float scale) override {
    const char* k = "cross_entropy_shard_backward";
    const int64_t n = logits.rows(), v = logits.cols();
    cuda::cross_entropy_shard_backward(stream_, arr(dlogits), carr(logits), carr(max), carr(sumexp),
                                       ids(targets), n, v, first, scale);
    launched(k);
  }
  void do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit, Tensor local_sumexp,
                                       Tensor local_max, Tensor max, Tensor logits, Tensor targets,
                                       int64_t first) override {
    const char* k = "cross_entropy_shard_partials";
    const int64_t n = logits.rows();
    cuda::cross_entropy_shard_partials(stream_, arr(sumexp), arr(target_logit), carr(local_sumexp),
                                       carr(local_max), carr(max), carr(logits), ids(targets), n,
                                       logits.cols(), first);
    launched(k);
  }
  void do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                     Tensor max) override {
    cuda::cross_entropy_shard_losses(stream_, arr(losses), carr(sumexp), carr(target_logit),
                                     carr(max), losses.numel());
    launched("cross_entropy_shard_losses");
  }

  void do_scale_rows(Tensor out, Tensor x, Tensor factor) override {
    const char* k = "scale_rows";
    cuda::scale_rows(stream_, arr(out), carr(x), carr(factor), x.rows(), x.cols());
    launched(k);
  }
  void do_row_dot(Tensor out, Tensor a, Tensor b) override {
    const char* k = "row_dot";
    cuda::row_dot(stream_, arr(out), carr(a), carr(b), a.rows(), a.cols());
    launched(k);
  }

  // --- Device scalars: nothing here waits for the device.
  void do_sum_squares_ranges(Tensor out, Tensor x, std::span<const SumRange> ranges) override {
    const char* k = "sum_squares_ranges";
    BOTTLE_CHECK(out.numel() <= cuda::reduce_max_slots(), "cuda backend: {}: {} slots, at most {}",
                 k, out.numel(), cuda::reduce_max_slots());
    std::vector<cuda::SlotRange> table;  // the ranges as the kernel reads them
    table.reserve(ranges.size());
    for (const SumRange& r : ranges)
      if (r.count > 0) table.push_back({r.offset, r.count, int32_t(r.slot)});
    const auto* device_table = static_cast<const cuda::SlotRange*>(range_table_.upload(
        device_memory_, table.data(), table.size() * sizeof(cuda::SlotRange), k));
    auto* partials = static_cast<double*>(this->scratch(
        sizeof(double) * size_t(cuda::reduce_partials_count()) * size_t(out.numel()), k));
    cuda::sum_squares_ranges(stream_, static_cast<double*>(out.data), int(out.numel()), carr(x),
                             device_table, int64_t(table.size()), partials);
    launched(k);
  }
  void do_accumulate_mean(Tensor acc, Tensor x) override {
    const char* k = "accumulate_mean";
    BOTTLE_CHECK(x.numel() > 0, "cuda backend: {} of an empty tensor", k);
    auto* partials = static_cast<double*>(reduce_partials_);
    cuda::accumulate_mean(stream_, static_cast<double*>(acc.data), carr(x), x.numel(), partials,
                          partials + cuda::reduce_partials_count());
    launched(k);
  }
  void do_scalar_add(Tensor out, Tensor a, Tensor b) override {
    scalar("scalar_add", out, a, b, 0.0, cuda::ScalarOp::add);
  }
  void do_scalar_divide(Tensor out, Tensor a, double divisor) override {
    scalar("scalar_divide", out, a, a, divisor, cuda::ScalarOp::divide);
  }
  void do_scalar_sqrt(Tensor out, Tensor a) override {
    scalar("scalar_sqrt", out, a, a, 0.0, cuda::ScalarOp::sqrt);
  }
  void do_clip_and_check(Tensor control, Tensor loss, Tensor norm, double max_norm) override {
    const char* k = "clip_and_check";
    cuda::clip_and_check(stream_, control.f32(), static_cast<const double*>(loss.data),
                         static_cast<const double*>(norm.data), max_norm);
    launched(k);
  }

  void do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m, Tensor v,
                       Tensor control, const AdamWArgs& a) override {
    const char* k = "adamw_update";
    std::vector<cuda::DecayGap> gaps;  // the no-decay ranges as the kernel reads them
    gaps.reserve(a.no_decay.size());
    bool on_groups = true;
    for (const ElementRange& r : a.no_decay) {
      if (r.count <= 0) continue;
      gaps.push_back({r.offset, r.offset + r.count});
      on_groups = on_groups && r.offset % 4 == 0 && r.count % 4 == 0;
    }
    const auto* device_gaps = static_cast<const cuda::DecayGap*>(
        gap_table_.upload(device_memory_, gaps.data(), gaps.size() * sizeof(cuda::DecayGap), k));
    cuda::AdamWParams params{a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.grad_scale, a.step};
    params.gaps_on_groups = on_groups;
    cuda::adamw_update(stream_, param.f32(), compute.empty() ? cuda::Array{} : arr(compute),
                       grad.f32(), m.f32(), v.f32(), param.numel(),
                       control.empty() ? nullptr : control.f32(), device_gaps, int64_t(gaps.size()),
                       params);
    launched(k);
  }

  void do_muon_momentum(Tensor update, Tensor buffer, Tensor grad, Tensor control,
                        const MuonArgs& a) override {
    cuda::muon_momentum(stream_, update.f32(), buffer.f32(), grad.f32(), grad.numel(),
                        control.empty() ? nullptr : control.f32(), a.momentum, a.grad_scale,
                        a.nesterov);
    launched("muon_momentum");
  }
  void do_muon_normalize(Tensor x, Tensor sumsq) override {
    cuda::muon_normalize(stream_, x.f32(), x.numel(), sumsq.f32());
    launched("muon_normalize");
  }
  void do_muon_apply(Tensor param, Tensor compute, Tensor update, Tensor control,
                     const MuonArgs& a) override {
    cuda::muon_apply(stream_, param.f32(), compute.empty() ? cuda::Array{} : arr(compute),
                     update.f32(), param.numel(), control.empty() ? nullptr : control.f32(),
                     1.0f - a.lr * a.weight_decay, a.lr * a.adjust);
    launched("muon_apply");
  }

 private:
  static constexpr size_t kPinnedBytes = 4096;
  static constexpr size_t kAllocationGranule = kAllocationAlignment;

  void scalar(const char* k, Tensor out, Tensor a, Tensor b, double divisor, cuda::ScalarOp op) {
    cuda::scalar_op(stream_, static_cast<double*>(out.data), static_cast<const double*>(a.data),
                    static_cast<const double*>(b.data), divisor, op);
    launched(k);
  }

  static cuda::Array arr(const Tensor& t) { return {t.data, t.dtype}; }
  static cuda::ConstArray carr(const Tensor& t) { return {t.data, t.dtype}; }
  static const int32_t* ids(const Tensor& t) { return static_cast<const int32_t*>(t.data); }

  // Every launch is checked at once: a bad configuration names its kernel. With
  // BOTTLE_CUDA_SYNC set, the stream is also drained, so that a fault inside a kernel is
  // reported by the op that caused it (slow; for debugging and the GPU check).
  void launched(std::string_view kernel) {
    check_cuda(cudaGetLastError(), kernel);
    if (sync_each_op_) sync(kernel);
  }
  void sync(std::string_view what) {
    ++host_waits_;
    check_cuda(cudaStreamSynchronize(stream_), what);
  }

  // Device scratch that grows and is reused; stream order keeps earlier users safe.
  void* scratch(size_t bytes, const char* what) {
    return scratch_.reserve(device_memory_, bytes, kAllocationGranule, what);
  }

  void norm_forward(const char* k, Tensor out, Tensor rstd, Tensor sumsq, Tensor x, Tensor weight,
                    float eps) {
    // rstd and sumsq are optional: an absent one is Tensor{}, no data, which the kernel skips.
    const int64_t n = x.rows(), c = x.cols();
    cuda::rmsnorm_forward(stream_, arr(out), arr(rstd), arr(sumsq), carr(x), carr(weight), n, c,
                          eps);
    launched(k);
  }
  void norm_backward(const char* k, Tensor dx, Tensor dweight, Tensor dout, Tensor x, Tensor weight,
                     Tensor rstd, Tensor dot, int64_t d) {
    const int64_t n = x.rows(), c = x.cols();  // dot is optional, as in norm_forward
    cuda::rmsnorm_backward(stream_, arr(dx), arr(dweight), carr(dout), carr(x), carr(weight),
                           carr(rstd), carr(dot), n, c, d, norm_scratch(n, c, k));
    launched(k);
  }
  // The partial sums of a norm's parameter gradients over row chunks (cuda::kernels.h).
  float* norm_scratch(int64_t rows, int64_t cols, const char* what) {
    const size_t bytes = cuda::norm_backward_scratch_bytes(rows, cols);
    return bytes ? static_cast<float*>(scratch(bytes, what)) : nullptr;
  }

  void rope(const char* kernel, Tensor q, Tensor k, float theta, float direction) {
    const int64_t seq = q.shape[1], hd = q.shape[3];
    cuda::rope(stream_, arr(q), arr(k), rope_table(seq, hd, theta), q.shape[0], seq, q.shape[2],
               k.shape[2], hd, direction);
    launched(kernel);
  }

  // cos and sin of every (position, pair), [2, seq, hd/2], computed on the host exactly as the
  // cpu backend computes its table (the same float expressions, the host's cosf / sinf) and
  // uploaded once per (seq, hd, theta): a run asks for one shape every time.
  const float* rope_table(int64_t seq, int64_t hd, float theta) {
    const auto key = std::make_tuple(seq, hd, theta);
    if (rope_table_.data() && rope_key_ == key)
      return static_cast<const float*>(rope_table_.data());
    const int64_t half = hd / 2;
    std::vector<float> table(size_t(2 * seq * half));  // [2, seq, hd/2]
    for (int64_t s = 0; s < seq; ++s)
      for (int64_t i = 0; i < half; ++i) {
        const float angle = float(s) * kmath::rope_inv_freq(i, hd, theta);
        table[size_t(s * half + i)] = std::cos(angle);
        table[size_t((seq + s) * half + i)] = std::sin(angle);
      }
    const auto* device = static_cast<const float*>(rope_table_.upload(
        device_memory_, table.data(), table.size() * sizeof(float), "RoPE table"));
    rope_key_ = key;  // once the table holds it
    return device;
  }

  static cuda::SdpaShape attention_shape(const char* k, const Tensor& q, const Tensor& kt,
                                         const Tensor& v) {
    // The shapes were checked by Backend; the own kernels' tiles end at head dim 256.
    (void)v;
    BOTTLE_CHECK(q.shape[3] <= 256, "cuda backend: {}: head dim {} (at most 256)", k, q.shape[3]);
    return {q.shape[0], q.shape[1], q.shape[2], kt.shape[2], q.shape[3]};
  }

  double reduce(const char* k, Tensor x, bool squares) {
    if (!x.numel()) return 0.0;
    auto* partials = static_cast<double*>(reduce_partials_);
    double* result = partials + cuda::reduce_partials_count();
    cuda::reduce_sum(stream_, carr(x), x.numel(), squares, partials, result);
    launched(k);
    check_cuda(cudaMemcpyAsync(pinned_, result, sizeof(double), cudaMemcpyDeviceToHost, stream_),
               k);
    sync(k);
    double value = 0.0;
    std::memcpy(&value, pinned_, sizeof value);
    return value;
  }

  // C = beta C, an empty sum (k = 0): zeros when beta is 0, whatever C held.
  void scale_c(const GemmArgs& g) {
    const size_t e = dtype_size(g.c_dtype);
    for (int64_t i = 0; i < g.batch; ++i) {
      char* c = static_cast<char*>(g.c) + i * g.stride_c * int64_t(e);
      if (g.reads_other_c()) {
        const char* c_in = static_cast<const char*>(g.c_in) + i * g.stride_c * int64_t(e);
        check_cuda(cudaMemcpy2DAsync(c, g.ldc * e, c_in, g.ldc * e, g.n * e, g.m,
                                     cudaMemcpyDeviceToDevice, stream_),
                   "gemm (k = 0)");
      }
      if (g.beta == 0.0f) {
        check_cuda(cudaMemset2DAsync(c, g.ldc * e, 0, g.n * e, g.m, stream_), "gemm (k = 0)");
      } else {
        for (int64_t r = 0; r < g.m; ++r)
          cuda::scale(stream_, {c + r * g.ldc * int64_t(e), g.c_dtype}, g.beta, g.n);
      }
    }
    launched("gemm (k = 0)");
  }

  // A mix cuBLASLt does not take: every bf16 operand is widened into fp32 scratch (exact), the
  // GEMM runs in fp32, and a bf16 C is rounded back once. Each operand's whole span is
  // converted, batch gaps included: reading a gap is harmless and keeps the strides.
  void gemm_widened(const GemmArgs& g) {
    auto span = [&](int64_t rows, int64_t ld, int64_t cols, int64_t stride) {
      return (g.batch - 1) * stride + (rows - 1) * ld + cols;
    };
    const int64_t a_rows = g.trans_a ? g.k : g.m, a_cols = g.trans_a ? g.m : g.k;
    const int64_t b_rows = g.trans_b ? g.n : g.k, b_cols = g.trans_b ? g.k : g.n;
    const int64_t na = g.a_dtype == DType::bf16 ? span(a_rows, g.lda, a_cols, g.stride_a) : 0;
    const int64_t nb = g.b_dtype == DType::bf16 ? span(b_rows, g.ldb, b_cols, g.stride_b) : 0;
    const int64_t nc = g.c_dtype == DType::bf16 ? span(g.m, g.ldc, g.n, g.stride_c) : 0;
    const size_t bytes =
        aligned_size(4 * size_t(na)) + aligned_size(4 * size_t(nb)) + aligned_size(4 * size_t(nc));
    char* base = static_cast<char*>(scratch(bytes, "widened GEMM operands"));
    float* wa = reinterpret_cast<float*>(base);
    float* wb = reinterpret_cast<float*>(base + aligned_size(4 * size_t(na)));
    float* wc = reinterpret_cast<float*>(base + aligned_size(4 * size_t(na)) +
                                         aligned_size(4 * size_t(nb)));
    GemmArgs f = g;
    f.a_dtype = f.b_dtype = f.c_dtype = DType::f32;
    if (na) cuda::convert(stream_, {wa, DType::f32}, {g.a, DType::bf16}, na), f.a = wa;
    if (nb) cuda::convert(stream_, {wb, DType::f32}, {g.b, DType::bf16}, nb), f.b = wb;
    if (nc) {
      if (g.beta != 0.0f) cuda::convert(stream_, {wc, DType::f32}, {g.c_read(), DType::bf16}, nc);
      f.c = wc;
      f.c_in = nullptr;  // widened into wc
    }
    launched("gemm (widening)");
    gemm_->run(f, stream_);
    launched("gemm");
    // Only the m × n entries of each batch item are C's; the gaps between them belong to
    // other tensors and must not be written.
    if (nc) {
      for (int64_t i = 0; i < g.batch; ++i)
        cuda::convert_columns(stream_, {static_cast<char*>(g.c) + 2 * i * g.stride_c, DType::bf16},
                              g.ldc, 0, {wc + i * g.stride_c, DType::f32}, g.ldc, 0, g.m, g.n);
      launched("gemm (narrowing)");
    }
  }

  int device_ = 0;
  int sm_major_ = 0;  // the GPU's compute capability, major (9: Hopper)
  cudaStream_t stream_ = nullptr;
  std::optional<cuda::GemmLt> gemm_;  // from the constructor on, once the device is chosen
  void* reduce_partials_ = nullptr;   // reduce_partials_count() doubles, then the result
  void* pinned_ = nullptr;            // small device → host reads
  cuda::DeviceMemory device_memory_;  // on stream_ and device_, from the constructor on
  cuda::GrowingBuffer<cuda::DeviceMemory> scratch_;
  bool sync_each_op_ = false;
  int64_t host_waits_ = 0;          // host_waits()
  std::vector<cudaEvent_t> marks_;  // timing marks, [0, marks_used_) recorded
  size_t marks_used_ = 0;
  std::unique_ptr<cuda::PinnedStaging> staging_;  // from_host's small copies, on first use
  // The device copies of sum_squares_ranges' and adamw_update's tables, with the host bytes
  // they were made from.
  cuda::DeviceTable range_table_, gap_table_;
  cuda::DeviceTable rope_table_;  // rope_table's, for rope_key_
  std::tuple<int64_t, int64_t, float> rope_key_{};
  std::optional<cuda::AttentionRouter> attention_;  // cuDNN or own, per call
};

}  // namespace

std::string cuda_unavailable() {
  int devices = 0;
  const cudaError_t status = cudaGetDeviceCount(&devices);
  if (status != cudaSuccess)
    return fmt::format("no CUDA device is usable (cudaGetDeviceCount: {})",
                       cudaGetErrorString(status));
  if (devices == 0) return "no CUDA device is visible";
  return {};
}

std::unique_ptr<Backend> make_cuda_backend(AttentionChoice attention,
                                           cuda::CudnnLoader load_cudnn) {
  auto backend = std::make_unique<CudaBackend>(attention, load_cudnn);
  // Refused once the backend is whole, so that its destructor frees what it holds.
  if (std::string why = backend->cudnn_refusal(); !why.empty())
    fail("cuda backend: attention \"cudnn\" was chosen, but {}", why);
  return backend;
}

std::string cuda_description() {
  int runtime = 0;
  cudaRuntimeGetVersion(&runtime);
  const size_t lt = cublasLtGetVersion();
  std::string s =
      fmt::format("cuda: CUDA runtime {}.{}, cuBLASLt {}.{}.{} GEMMs + own kernels", runtime / 1000,
                  runtime % 1000 / 10, lt / 10000, lt / 100 % 100, lt % 100);
  if (std::string why = cuda_unavailable(); !why.empty()) return s + " (" + why + ")";
  int device = 0;
  cudaGetDevice(&device);
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) == cudaSuccess)
    s += fmt::format("; {} (sm_{}{}, {})", prop.name, prop.major, prop.minor,
                     format_bytes(prop.totalGlobalMem));
  return s;
}

}  // namespace bottle
