#include "backend/dnnl_gemm.h"

#include <dnnl.hpp>
#include <map>
#include <mutex>
#include <tuple>

namespace bottle {
namespace {

using Key = std::tuple<bool, bool, int64_t, int64_t, int64_t, float, float, int64_t, int64_t,
                       int64_t, int64_t, int64_t, int64_t, int64_t, int, int, int>;

struct Cached {
  dnnl::memory::desc a, b, c;
  dnnl::matmul primitive;
};

struct Engine {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  std::map<Key, Cached> cache;
  std::mutex mutex;
};

Engine& engine() {
  static Engine e;
  return e;
}

dnnl::memory::data_type to_dnnl(DType t) {
  return t == DType::bf16 ? dnnl::memory::data_type::bf16 : dnnl::memory::data_type::f32;
}

Cached make(const GemmArgs& g) {
  using dims = dnnl::memory::dims;
  // op(A) is m x k: element (i, p) lives at i*lda + p, or p*lda + i when transposed.
  dims a_strides = g.trans_a ? dims{g.stride_a, 1, g.lda} : dims{g.stride_a, g.lda, 1};
  dims b_strides = g.trans_b ? dims{g.stride_b, 1, g.ldb} : dims{g.stride_b, g.ldb, 1};
  dims c_strides{g.stride_c, g.ldc, 1};
  // oneDNN wants a non-zero batch stride even for one matrix.
  if (g.batch == 1) {
    a_strides[0] = g.m * g.k;
    b_strides[0] = g.k * g.n;
    c_strides[0] = g.m * g.ldc;
  }
  // A zero batch stride broadcasts one matrix over the batch: B for GQA (one kv head, many
  // q heads), A for grouped projections (one input, several weights).
  const int64_t b_batch = g.stride_b == 0 ? 1 : g.batch;
  if (b_batch == 1) b_strides[0] = g.k * g.n;
  const int64_t a_batch = g.stride_a == 0 ? 1 : g.batch;
  if (a_batch == 1) a_strides[0] = g.m * g.k;
  Cached out;
  out.a = dnnl::memory::desc({a_batch, g.m, g.k}, to_dnnl(g.a_dtype), a_strides);
  out.b = dnnl::memory::desc({b_batch, g.k, g.n}, to_dnnl(g.b_dtype), b_strides);
  out.c = dnnl::memory::desc({g.batch, g.m, g.n}, to_dnnl(g.c_dtype), c_strides);
  dnnl::primitive_attr attr;
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops ops;
    ops.append_sum(g.beta);
    attr.set_post_ops(ops);
  }
  dnnl::matmul::desc desc(out.a, out.b, out.c);
  dnnl::matmul::primitive_desc pd(desc, attr, engine().engine);
  out.primitive = dnnl::matmul(pd);
  return out;
}

}  // namespace

std::string dnnl_bf16_matmul() {
  // oneDNN answers a bf16 matmul on any CPU with some implementation; only a jit one (not
  // "ref", a plain loop far slower than widening to fp32) runs on bf16 instructions.
  try {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const dnnl::memory::desc a({64, 64}, dt::bf16, tag::ab), b({64, 64}, dt::bf16, tag::ab),
        c({64, 64}, dt::f32, tag::ab);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), engine().engine);
    const std::string impl = pd.impl_info_str();
    if (impl.find("ref") != std::string::npos) return {};
    return impl;
  } catch (const dnnl::error&) {
    return {};
  }
}

void dnnl_gemm(const GemmArgs& g) {
  if (g.m == 0 || g.n == 0 || g.batch == 0) return;
  BOTTLE_ASSERT(g.k > 0, "gemm with k = 0");
  Engine& e = engine();
  const Key key{g.trans_a,      g.trans_b,     g.m,        g.n,        g.k,
                g.alpha,        g.beta,        g.lda,      g.stride_a, g.ldb,
                g.stride_b,     g.ldc,         g.stride_c, g.batch,    int(g.a_dtype),
                int(g.b_dtype), int(g.c_dtype)};
  const Cached* cached;
  {
    std::lock_guard lock(e.mutex);
    auto it = e.cache.find(key);
    if (it == e.cache.end()) it = e.cache.emplace(key, make(g)).first;
    cached = &it->second;
  }
  dnnl::memory a(cached->a, e.engine, const_cast<void*>(g.a));
  dnnl::memory b(cached->b, e.engine, const_cast<void*>(g.b));
  dnnl::memory c(cached->c, e.engine, g.c);
  cached->primitive.execute(e.stream,
                            {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
  e.stream.wait();
}

}  // namespace bottle
