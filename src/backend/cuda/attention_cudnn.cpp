// cuDNN's SDPA for the cuda backend (attention_cudnn.h says what and why). Host C++: the
// frontend builds cuDNN graphs and launches them on the backend's stream; compiled with
// NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING, so every cuDNN call goes through the libcudnn.so.9
// this file dlopens, and bottle has no link-time dependency on cuDNN.
//
// Layout: bottle's q, k, v, out are [B, S, heads, hd] rows; cuDNN's SDPA names its dimensions
// [B, heads, S, hd] and takes any strides, so each tensor is described in place with strides
// {S·heads·hd, hd, heads·hd, 1}: no transposes. The statistics cuDNN's forward emits
// (generate_stats, natural log by default: max + ln Σ exp(s - max) of the scaled scores s) are
// exactly bottle's lse = log Σ_j exp(q_i·k_j / sqrt(hd)), [B, H, S, 1] with strides
// {H·S, S, 1, 1}, i.e. bottle's [B, H, S] f32; backward reads them back as its Stats input.
#include "backend/cuda/attention_cudnn.h"

#include <cuda_runtime_api.h>
#include <cudnn_frontend.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <cmath>
#include <cstdlib>
#include <exception>
#include <map>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include "backend/attention_workspace.h"
#include "core/error.h"

// The frontend's dynamic loading resolves every cuDNN symbol through this handle, which
// cudnn_frontend_shim.h declares and the program defines once.
namespace cudnn_frontend {
void* cudnn_dlhandle = nullptr;
}  // namespace cudnn_frontend

namespace bottle::cuda {

std::string describe(const SdpaShape& s) {
  return fmt::format("B {} S {} H {}/{} hd {}", s.batch, s.seq, s.heads, s.kv_heads, s.head_dim);
}

namespace {

namespace fe = cudnn_frontend;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// An internal error (a bug here, not the user's doing): named by file and line.
#define BOTTLE_CUDNN_INTERNAL(cond, what)                                               \
  do {                                                                                  \
    if (!(cond)) ::bottle::fail("{}:{}: internal error: {}", __FILE__, __LINE__, what); \
  } while (0)

// The variant packs' tensor ids, the same in every graph.
enum Uid : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

std::string version_text(size_t v) {
  return fmt::format("{}.{}.{}", v / 10000, v / 100 % 100, v % 100);
}

// libcudnn.so.9, opened once per process. The frontend keeps each cuDNN symbol it resolves in a
// function-local static on first use, so the handle is set before any frontend call and never
// changes; a library that is not cuDNN 9 is closed and the handle stays unset.
struct Library {
  size_t version = 0;  // cudnnGetVersion(): 91900 for 9.19.0; 0 when not loaded
  std::string why;     // why it is not loaded
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    // The frontend also opens the CUDA runtime by name, trying libcudart.so.12 and .13 and
    // taking the first it finds: name the one bottle is linked against (already loaded, so
    // the same library), unless the user chose one.
    ::setenv("CUDNN_FRONTEND_CUDART_LIB_NAME",
             fmt::format("libcudart.so.{}", CUDART_VERSION / 1000).c_str(), 0);
    // The deterministic backward's dP workspace is bounded (backend/attention_workspace.h), unless
    // the user bounded it: above the bound, Hopper with cuDNN >= 9.25 takes the ordered-dQ
    // engine, whose workspace is linear in the sequence.
    ::setenv(kCudnnDpWorkspaceLimitVariable, std::to_string(kSdpaDpWorkspaceBound).c_str(), 0);
    dlerror();
    void* handle = dlopen("libcudnn.so.9", RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* error = dlerror();
      l.why = error ? error : "libcudnn.so.9: dlopen failed";
      return l;
    }
    using GetVersion = size_t (*)();
    const auto get_version = reinterpret_cast<GetVersion>(dlsym(handle, "cudnnGetVersion"));
    const size_t version = get_version ? get_version() : 0;
    if (version / 10000 != 9) {
      l.why = get_version ? fmt::format("libcudnn.so.9 is cuDNN {}, not 9", version_text(version))
                          : std::string("libcudnn.so.9 has no cudnnGetVersion");
      dlclose(handle);
      return l;
    }
    fe::cudnn_dlhandle = handle;
    l.version = version;
    return l;
  }();
  return lib;
}

std::string status_text(cudnnStatus_t status) {
  return fmt::format("{} ({})", fe::detail::get_error_string(status),
                     fe::detail::get_last_error_string_());
}

struct HandleDeleter {
  void operator()(cudnnHandle_t handle) const { (void)fe::detail::destroy_handle(handle); }
};
using Handle = std::unique_ptr<std::remove_pointer_t<cudnnHandle_t>, HandleDeleter>;

// A tensor of bottle's [batch, seq, heads, hd] rows, in cuDNN's [batch, heads, seq, hd] order.
fe::graph::Tensor_attributes& rows_layout(fe::graph::Tensor_attributes& t, int64_t batch,
                                          int64_t seq, int64_t heads, int64_t hd) {
  return t.set_dim({batch, heads, seq, hd}).set_stride({seq * heads * hd, hd, heads * hd, 1});
}
TensorPtr input_rows(fe::graph::Graph& g, const char* name, Uid uid, int64_t batch, int64_t seq,
                     int64_t heads, int64_t hd) {
  fe::graph::Tensor_attributes t;
  t.set_name(name).set_uid(uid);
  return g.tensor(rows_layout(t, batch, seq, heads, hd));
}
// lse [batch, heads, seq] f32, cuDNN's Stats [batch, heads, seq, 1].
fe::graph::Tensor_attributes& stats_layout(fe::graph::Tensor_attributes& t, const SdpaShape& s) {
  return t.set_dim({s.batch, s.heads, s.seq, 1})
      .set_stride({s.heads * s.seq, s.seq, 1, 1})
      .set_data_type(fe::DataType_t::FLOAT);
}

// bf16 in and out, fp32 softmax and accumulation: the own kernels' precision.
std::shared_ptr<fe::graph::Graph> new_graph() {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  return g;
}

float attention_scale(const SdpaShape& s) { return 1.0f / std::sqrt(float(s.head_dim)); }

// out, lse = SDPA(q, k, v), causal (each query sees the keys at or before its position, the
// diagonal aligned top-left: equal lengths), GQA from the heads' counts.
std::shared_ptr<fe::graph::Graph> forward_graph(const SdpaShape& s) {
  auto g = new_graph();
  const TensorPtr q = input_rows(*g, "q", kQ, s.batch, s.seq, s.heads, s.head_dim);
  const TensorPtr k = input_rows(*g, "k", kK, s.batch, s.seq, s.kv_heads, s.head_dim);
  const TensorPtr v = input_rows(*g, "v", kV, s.batch, s.seq, s.kv_heads, s.head_dim);
  fe::graph::SDPA_attributes options;
  options.set_name("bottle_attention_forward")
      .set_generate_stats(true)
      .set_attn_scale(attention_scale(s))
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0);
  auto [out, stats] = g->sdpa(q, k, v, options);
  BOTTLE_CUDNN_INTERNAL(out && stats, "sdpa() gave no O or Stats with generate_stats");
  rows_layout(out->set_output(true).set_uid(kO), s.batch, s.seq, s.heads, s.head_dim);
  stats_layout(stats->set_output(true).set_uid(kStats), s);
  return g;
}

// dq, dk, dv from dout, out, lse, q, k, v: cuDNN's deterministic algorithm (no floating-point
// atomics in dQ's sum over keys), so that a run repeats bit for bit, as with the own kernels.
std::shared_ptr<fe::graph::Graph> backward_graph(const SdpaShape& s) {
  auto g = new_graph();
  const TensorPtr q = input_rows(*g, "q", kQ, s.batch, s.seq, s.heads, s.head_dim);
  const TensorPtr k = input_rows(*g, "k", kK, s.batch, s.seq, s.kv_heads, s.head_dim);
  const TensorPtr v = input_rows(*g, "v", kV, s.batch, s.seq, s.kv_heads, s.head_dim);
  const TensorPtr out = input_rows(*g, "out", kO, s.batch, s.seq, s.heads, s.head_dim);
  const TensorPtr dout = input_rows(*g, "dout", kDO, s.batch, s.seq, s.heads, s.head_dim);
  fe::graph::Tensor_attributes stats_attributes;
  stats_attributes.set_name("lse").set_uid(kStats);
  const TensorPtr stats = g->tensor(stats_layout(stats_attributes, s));
  fe::graph::SDPA_backward_attributes options;
  options.set_name("bottle_attention_backward")
      .set_attn_scale(attention_scale(s))
      .set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT)
      .set_diagonal_band_right_bound(0)
      .set_deterministic_algorithm(true);
  auto [dq, dk, dv] = g->sdpa_backward(q, k, v, out, dout, stats, options);
  BOTTLE_CUDNN_INTERNAL(dq && dk && dv, "sdpa_backward() gave no dQ, dK or dV");
  rows_layout(dq->set_output(true).set_uid(kDQ), s.batch, s.seq, s.heads, s.head_dim);
  rows_layout(dk->set_output(true).set_uid(kDK), s.batch, s.seq, s.kv_heads, s.head_dim);
  rows_layout(dv->set_output(true).set_uid(kDV), s.batch, s.seq, s.kv_heads, s.head_dim);
  return g;
}

// Validates a graph, lowers it, asks cuDNN's heuristics for its engines, checks that one
// supports it, and compiles the plan. Empty when all went well, else the step and cuDNN's
// reason: in any of these steps that means cuDNN does not run this shape here.
std::string build(fe::graph::Graph& g, cudnnHandle_t handle) {
  const auto step = [](const char* name, fe::error_t e) {
    return e.is_good() ? std::string() : fmt::format("{}: {}", name, e.get_message());
  };
  try {
    if (std::string e = step("validate", g.validate()); !e.empty()) return e;
    if (std::string e = step("build_operation_graph", g.build_operation_graph(handle)); !e.empty())
      return e;
    if (std::string e =
            step("create_execution_plans", g.create_execution_plans({fe::HeurMode_t::A}));
        !e.empty())
      return e;
    if (std::string e = step("check_support", g.check_support()); !e.empty()) return e;
    return step("build_plans", g.build_plans());
  } catch (const std::exception& e) {
    // The frontend throws where it cannot go on (a cuDNN symbol missing from an older library).
    return e.what();
  }
}

class CudnnSdpa final : public CudnnAttention {
 public:
  CudnnSdpa(Handle handle, size_t version) : handle_(std::move(handle)), version_(version) {}

  std::string description() const override {
    return fmt::format("cuDNN {} SDPA (fused flash attention, deterministic backward)",
                       version_text(version_));
  }

  size_t version() const override { return version_; }

  std::string prepare(const SdpaShape& shape) override { return graphs(shape).refused; }

  size_t forward_workspace_bytes(const SdpaShape& shape) override {
    return ready(shape, "forward workspace").forward_workspace;
  }
  size_t backward_workspace_bytes(const SdpaShape& shape) override {
    return ready(shape, "backward workspace").backward_workspace;
  }

  void forward(void* out, float* lse, const void* q, const void* k, const void* v,
               const SdpaShape& shape, void* workspace) override {
    Graphs& g = ready(shape, "forward");
    // The frontend's variant pack takes every pointer as void*; inputs are only read.
    std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                            {kK, const_cast<void*>(k)},
                                            {kV, const_cast<void*>(v)},
                                            {kO, out},
                                            {kStats, lse}};
    execute(*g.forward, pack, workspace, "forward", shape);
  }

  void backward(void* dq, void* dk, void* dv, const void* dout, const void* out, const float* lse,
                const void* q, const void* k, const void* v, const SdpaShape& shape,
                void* workspace) override {
    Graphs& g = ready(shape, "backward");
    std::unordered_map<int64_t, void*> pack{{kQ, const_cast<void*>(q)},
                                            {kK, const_cast<void*>(k)},
                                            {kV, const_cast<void*>(v)},
                                            {kO, const_cast<void*>(out)},
                                            {kDO, const_cast<void*>(dout)},
                                            {kStats, const_cast<float*>(lse)},
                                            {kDQ, dq},
                                            {kDK, dk},
                                            {kDV, dv}};
    execute(*g.backward, pack, workspace, "backward", shape);
  }

 private:
  struct Graphs {
    std::shared_ptr<fe::graph::Graph> forward, backward;
    size_t forward_workspace = 0, backward_workspace = 0;
    std::string refused;  // why cuDNN does not run the shape; empty when it does
  };

  // The shape's graphs, built on first use; a refusal is kept too, so it is asked once.
  Graphs& graphs(const SdpaShape& shape) {
    auto it = graphs_.find(shape);
    if (it != graphs_.end()) return it->second;
    Graphs g;
    std::string why;
    try {
      g.forward = forward_graph(shape);
      g.backward = backward_graph(shape);
    } catch (const std::exception& e) {
      why = fmt::format("building the graphs: {}", e.what());
    }
    if (why.empty()) {
      if (std::string e = build(*g.forward, handle_.get()); !e.empty()) why = "forward " + e;
    }
    if (why.empty()) {
      if (std::string e = build(*g.backward, handle_.get()); !e.empty()) why = "backward " + e;
    }
    if (why.empty()) {
      g.forward_workspace = workspace_bytes(*g.forward, "forward", shape);
      g.backward_workspace = workspace_bytes(*g.backward, "backward", shape);
    } else {
      g = Graphs{};
      g.refused =
          fmt::format("cuDNN {} refuses {}: {}", version_text(version_), describe(shape), why);
    }
    return graphs_.emplace(shape, std::move(g)).first->second;
  }

  // A shape the backend decided to run on cuDNN: prepare() said yes before.
  Graphs& ready(const SdpaShape& shape, const char* what) {
    Graphs& g = graphs(shape);
    if (!g.refused.empty()) fail("cuDNN attention {} at {}: {}", what, describe(shape), g.refused);
    return g;
  }

  static size_t workspace_bytes(fe::graph::Graph& g, const char* what, const SdpaShape& shape) {
    int64_t bytes = 0;
    if (fe::error_t e = g.get_workspace_size(bytes); e.is_bad())
      fail("cuDNN attention {} at {}: get_workspace_size: {}", what, describe(shape),
           e.get_message());
    BOTTLE_CUDNN_INTERNAL(bytes >= 0, "negative cuDNN workspace size");
    return size_t(bytes);
  }

  void execute(fe::graph::Graph& g, std::unordered_map<int64_t, void*>& pack, void* workspace,
               const char* what, const SdpaShape& shape) {
    fe::error_t e;
    try {
      e = g.execute(handle_.get(), pack, workspace);
    } catch (const std::exception& x) {
      fail("cuDNN attention {} at {}: execute: {}", what, describe(shape), x.what());
    }
    if (e.is_bad())
      fail("cuDNN attention {} at {}: execute: {}", what, describe(shape), e.get_message());
  }

  Handle handle_;
  size_t version_ = 0;
  std::map<SdpaShape, Graphs> graphs_;
};

}  // namespace

std::string cudnn_library_status() {
  const Library& lib = library();
  if (!lib.version) return "cuDNN not loadable: " + lib.why;
  Dl_info info{};
  const void* symbol = dlsym(fe::cudnn_dlhandle, "cudnnGetVersion");
  const char* file =
      symbol && dladdr(symbol, &info) && info.dli_fname ? info.dli_fname : "libcudnn.so.9";
  return fmt::format("cuDNN {} SDPA, from {}", version_text(lib.version), file);
}

CudnnLoad load_cudnn_attention(void* stream) {
  const Library& lib = library();
  if (!lib.version) return {nullptr, lib.why};
  cudnnHandle_t raw = nullptr;
  try {
    if (const cudnnStatus_t s = fe::detail::create_handle(&raw); s != CUDNN_STATUS_SUCCESS)
      return {nullptr, "cudnnCreate: " + status_text(s)};
    Handle handle(raw);
    if (const cudnnStatus_t s =
            fe::detail::set_stream(handle.get(), static_cast<cudaStream_t>(stream));
        s != CUDNN_STATUS_SUCCESS)
      fail("cuDNN attention: cudnnSetStream: {}", status_text(s));
    return {std::make_unique<CudnnSdpa>(std::move(handle), lib.version), {}};
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    // A symbol the frontend needs is missing from this libcudnn: no cuDNN attention here.
    return {nullptr, fmt::format("cuDNN {}: {}", version_text(lib.version), e.what())};
  }
}

}  // namespace bottle::cuda
