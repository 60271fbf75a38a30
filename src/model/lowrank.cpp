#include "model/lowrank.h"

#include <dlfcn.h>
#include <lapacke.h>

#include <cmath>
#include <map>

namespace bottle {

namespace {

// LAPACKE_dgesdd, loaded when a factorisation first needs it rather than linked: Debian's
// liblapack.so.3 is usually OpenBLAS, whose start-up reserves buffers for every thread, which
// every other command would pay for (and which spins under a small `ulimit -v` instead of
// failing).
using Dgesdd = lapack_int (*)(int, char, lapack_int, lapack_int, double*, lapack_int, double*,
                              double*, lapack_int, double*, lapack_int);
Dgesdd lapacke_dgesdd() {
  static const Dgesdd dgesdd = [] {
    void* lapacke = ::dlopen("liblapacke.so.3", RTLD_NOW | RTLD_LOCAL);
    BOTTLE_CHECK(lapacke, "lowrank: cannot load LAPACK ({}); install Debian's liblapacke",
                 ::dlerror());
    void* symbol = ::dlsym(lapacke, "LAPACKE_dgesdd");
    BOTTLE_CHECK(symbol, "lowrank: liblapacke.so.3 has no LAPACKE_dgesdd");
    return reinterpret_cast<Dgesdd>(symbol);
  }();
  return dgesdd;
}

// The parameter `name` of a one-process model, on the host.
std::vector<float> host_copy(const ParameterStore& params, const std::string& name) {
  const Param p = params.get(name);
  std::vector<float> out(size_t(p.value.numel()));
  params.backend().to_host(out.data(), p.value);
  return out;
}

struct Factors {
  std::vector<float> A, B;  // [r, d_in], [d_out, r]
  double relative_error = 0.0;
};

// Truncated SVD of W [m, n] (row-major) in double precision through LAPACK's dgesdd.
Factors factorize(const std::vector<float>& W, int64_t m, int64_t n, int64_t r,
                  const std::string& name) {
  const int64_t k = std::min(m, n);
  std::vector<double> a(W.begin(), W.end());  // [m, n], overwritten by dgesdd
  std::vector<double> s(static_cast<size_t>(k)), u(static_cast<size_t>(m * k)),
      vt(static_cast<size_t>(k * n));  // [k], [m, k], [k, n]
  const lapack_int info =
      lapacke_dgesdd()(LAPACK_ROW_MAJOR, 'S', lapack_int(m), lapack_int(n), a.data(), lapack_int(n),
                       s.data(), u.data(), lapack_int(k), vt.data(), lapack_int(n));
  BOTTLE_CHECK(info == 0, "{}: the SVD did not converge (LAPACK dgesdd info {})", name, info);
  Factors f;
  f.A.resize(size_t(r * n));
  f.B.resize(size_t(m * r));
  for (int64_t i = 0; i < r; ++i) {
    const double root = std::sqrt(s[size_t(i)]);
    for (int64_t j = 0; j < n; ++j) f.A[size_t(i * n + j)] = float(root * vt[size_t(i * n + j)]);
    for (int64_t j = 0; j < m; ++j) f.B[size_t(j * r + i)] = float(u[size_t(j * k + i)] * root);
  }
  double kept = 0.0, total = 0.0;
  for (int64_t i = 0; i < k; ++i) {
    const double e = s[size_t(i)] * s[size_t(i)];
    total += e;
    if (i >= r) kept += e;
  }
  f.relative_error = total > 0.0 ? std::sqrt(kept / total) : 0.0;
  return f;
}

}  // namespace

ModelConfig lowrank_config(const ModelConfig& dense, BottleneckKind kind, int64_t rank) {
  BOTTLE_CHECK(dense.bottleneck == BottleneckKind::none,
               "lowrank: the model is already low-rank ({}); start from a full-rank one",
               bottleneck_kind_name(dense.bottleneck));
  BOTTLE_CHECK(kind == BottleneckKind::svd || kind == BottleneckKind::cola,
               "lowrank: --kind must be svd or cola, got {}", bottleneck_kind_name(kind));
  BOTTLE_CHECK(rank > 0, "lowrank: --rank must be positive, got {}", rank);
  for (int i = 0; i < kNumProjections; ++i) {
    const auto p = ProjectionId(i);
    const int64_t limit = std::min(dense.d_in(p), dense.d_out(p));
    BOTTLE_CHECK(rank <= limit,
                 "lowrank: --rank {} exceeds the {} projection's min(d_in, d_out) = min({}, {}) = "
                 "{}; no rank-{} factorisation of it exists",
                 rank, kProjectionNames[i], dense.d_in(p), dense.d_out(p), limit, rank);
  }
  ModelConfig c = dense;
  c.bottleneck = kind;
  c.rank = rank;
  c.ranks = {};
  c.mlp_gate_act = dense.gate_act();  // the dense MLP's SiLU on gate stays
  return c;
}

std::unique_ptr<LlamaModel> factorize_model(const LlamaModel& dense, BottleneckKind kind,
                                            int64_t rank, std::vector<FactorReport>& reports) {
  BOTTLE_CHECK(dense.stage().stages == 1 && !dense.tensor_parallel().comm,
               "lowrank: factorises a model held by one process");
  const ModelConfig& c = dense.config();
  auto low = std::make_unique<LlamaModel>(lowrank_config(c, kind, rank));
  const ParameterStore& from = dense.parameters();
  const ParameterStore& to = low->parameters();
  std::map<std::string, std::vector<float>> values;  // the new model's tensors, by name
  for (int layer = 0; layer < c.num_layers; ++layer)
    for (int i = 0; i < kNumProjections; ++i) {
      const auto p = ProjectionId(i);
      const std::string prefix = projection_prefix(layer, p);
      const int64_t d_out = c.d_out(p), d_in = c.d_in(p);
      Factors f =
          factorize(host_copy(from, prefix + ".weight"), d_out, d_in, rank, prefix + ".weight");
      reports.push_back({prefix + ".weight", d_out, d_in, rank, f.relative_error});
      values[prefix + ".A.weight"] = std::move(f.A);
      values[prefix + ".B.weight"] = std::move(f.B);
    }
  for (const ParamSpec& spec : to.specs()) {
    auto it = values.find(spec.name);
    // Everything but the projections (embeddings, norms, LM head) is the dense model's.
    const std::vector<float> v =
        it != values.end() ? std::move(it->second) : host_copy(from, spec.name);
    BOTTLE_CHECK(int64_t(v.size()) == spec.shape.numel(), "lowrank: {} has {} values, expected {}",
                 spec.name, v.size(), spec.shape.numel());
    to.backend().from_host(to.get(spec.name).value, v.data());
  }
  to.refresh_compute(to.backend());
  return low;
}

}  // namespace bottle
