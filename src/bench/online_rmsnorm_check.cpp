#include "bench/online_rmsnorm_check.h"

#include <array>
#include <cmath>
#include <random>
#include <vector>

#include "core/arena.h"
#include "nn/linear.h"
#include "parallel/online_rmsnorm.h"

namespace bottle {
namespace {

std::vector<float> floats(int64_t count) { return std::vector<float>(size_t(count), 0.0f); }

// dx [N, in] = dy [N, out] · W [out, in]: the input gradient alone (A's own gradient is
// not compared, so its GEMM is skipped).
void input_gradient(Backend& be, Tensor dx, Tensor dy, Tensor w) {
  GemmArgs g;
  g.m = dx.rows(), g.n = dx.cols(), g.k = dy.cols();
  g.a = dy.data, g.lda = dy.cols();
  g.b = w.data, g.ldb = w.cols();
  g.c = dx.data, g.ldc = dx.cols();
  be.gemm(g);
}

// Columns [first, first + width) of a row-major [rows, cols] matrix.
std::vector<float> columns(const std::vector<float>& m, int64_t rows, int64_t cols, int64_t first,
                           int64_t width) {
  std::vector<float> out = floats(rows * width);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < width; ++j)
      out[size_t(i * width + j)] = m[size_t(i * cols + first + j)];
  return out;
}

// `parts` holds each rank's [rows, width] columns one after another (an all-gather).
AbsDiff diff_of_column_parts(const float* parts, const std::vector<float>& whole, int64_t rows,
                             int64_t width, int ranks) {
  AbsDiff d;
  const int64_t cols = width * ranks;
  for (int r = 0; r < ranks; ++r)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < width; ++j) {
        const double e = std::fabs(double(parts[(r * rows + i) * width + j]) -
                                   double(whole[size_t(i * cols + r * width + j)]));
        d.max = std::max(d.max, e);
        d.mean += e;
      }
  d.mean /= double(rows * cols);
  return d;
}

// The ranks' parts side by side on every rank (one rank: the part itself).
std::vector<float> gather(const TensorParallel& tp, std::vector<float> part, const char* site) {
  if (tp.size() == 1) return part;
  std::vector<float> all(part.size() * size_t(tp.size()));
  tp.comm->all_gather(host_tensor(std::span(all)), host_tensor(std::span(part)), site);
  return all;
}

// A tensor's elements, staged to the host.
std::vector<float> to_host(Backend& be, Tensor t) {
  std::vector<float> host(size_t(t.numel()));
  be.to_host(host.data(), t);
  return host;
}

// A new tensor of `shape` holding `host`.
Tensor staged(Backend& be, Arena& arena, Shape shape, const std::vector<float>& host) {
  Tensor t = arena.alloc(shape);
  be.from_host(t, host.data());
  return t;
}

}  // namespace

OnlineNormDiffs compare_online_rmsnorm(Backend& be, const TensorParallel& tp,
                                       const OnlineNormProblem& problem) {
  const int t = tp.size(), me = tp.rank();
  const int64_t n = problem.rows, d = problem.hidden, r = problem.rank;
  BOTTLE_CHECK(n > 0 && d > 0 && r > 0 && d % t == 0,
               "online RMSNorm check: rows {}, hidden {} and rank {} must be positive and the "
               "hidden divisible by the {} rank(s)",
               n, d, r, t);
  const int64_t dl = d / t;
  std::vector<float> x = floats(n * d), gamma = floats(d), a = floats(r * d), dz = floats(n * r);
  // Drawn once on the host and broadcast: at the bench's sizes drawing takes longer than
  // the GEMMs.
  if (me == 0) {
    std::mt19937 rng(problem.seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (auto& v : x) v = normal(rng);
    for (auto& v : gamma) v = 1.0f + problem.gamma_spread * normal(rng);
    for (auto& v : a) v = problem.weight_std * normal(rng);
    for (auto& v : dz) v = normal(rng);
  }
  if (t > 1)
    for (std::vector<float>* v : {&x, &gamma, &a, &dz})
      tp.comm->broadcast(host_tensor(std::span(*v)), 0, "check.norm.inputs");
  Arena arena(MemoryTag::activations, be);
  const Tensor DZ = staged(be, arena, {n, r}, dz);  // [N, r] ∂z, whole on every rank

  // This rank: its columns [me·d/t, (me+1)·d/t) of x, γ and A.
  const Tensor XL = staged(be, arena, {n, dl}, columns(x, n, d, me * dl, dl)),
               AL = staged(be, arena, {r, dl}, columns(a, r, d, me * dl, dl));
  OnlineRMSNorm norm;
  norm.weight =
      Param{staged(be, arena, {dl}, columns(gamma, 1, d, me * dl, dl)), arena.alloc({dl})};
  norm.eps = problem.eps;
  norm.d = d;
  norm.allocate_activations(arena, n, dl);
  const Tensor slab = arena.alloc({n * r + n});  // [z | S]: one all-reduce, as in btp
  const Tensor z = slab.view(0, {n, r}), sumsq = slab.view(n * r, {n});
  norm.forward_local(be, XL, sumsq);
  linear_forward(be, z, norm.out, AL);
  const std::array<Tensor, 1> zs{z};
  norm.scale_partials(be, zs, sumsq);
  if (tp.comm) tp.comm->all_reduce(slab, ReduceOp::sum, "check.norm");
  norm.finish(be, zs, sumsq);
  // Backward: dn_i = dz A_i locally, then the norm's backward with the whole-row statistic.
  const Tensor DNL = arena.alloc({n, dl}), DXL = arena.alloc({n, dl});
  const std::array<std::pair<Tensor, Tensor>, 1> latents{std::pair{z, DZ}};
  if (tp.norm_backward == NormStatistic::from_latent) norm.latent_statistic(be, latents);
  input_gradient(be, DNL, DZ, AL);
  norm.backward(be, tp, DXL, DNL, XL, "check.norm.stat").get();
  const std::vector<float> dx_parts = gather(tp, to_host(be, DXL), "check.norm.dx"),
                           dgamma_parts =
                               gather(tp, to_host(be, norm.weight.grad), "check.norm.dgamma");

  std::array<float, 6> result{};  // the differences, from rank 0 to every rank
  if (me == 0) {
    // One rank: RMSNorm, then z = n Aᵀ; backward dn = dz A, then RMSNorm's backward.
    Arena whole(MemoryTag::activations, be);
    const Tensor X = staged(be, whole, {n, d}, x), G = staged(be, whole, {d}, gamma),
                 A = staged(be, whole, {r, d}, a);
    const Tensor normed = whole.alloc({n, d}), rstd = whole.alloc({n}), z_ref = whole.alloc({n, r}),
                 dx_ref = whole.alloc({n, d}), dgamma = whole.alloc({d});
    be.rmsnorm_forward(normed, rstd, X, G, norm.eps);
    linear_forward(be, z_ref, normed, A);
    const Tensor dn = normed;  // the normalised input is not read again
    input_gradient(be, dn, DZ, A);
    be.rmsnorm_backward(dx_ref, dgamma, dn, X, G, rstd);
    const AbsDiff out = diff_of_column_parts(to_host(be, z).data(), to_host(be, z_ref), n, r, 1),
                  dx = diff_of_column_parts(dx_parts.data(), to_host(be, dx_ref), n, dl, t),
                  dg = diff_of_column_parts(dgamma_parts.data(), to_host(be, dgamma), 1, dl, t);
    result = {float(out.max), float(out.mean), float(dx.max),
              float(dx.mean), float(dg.max),   float(dg.mean)};
  }
  if (tp.comm) tp.comm->broadcast(host_tensor(std::span(result)), 0, "check.norm.result");
  return {{result[0], result[1]}, {result[2], result[3]}, {result[4], result[5]}};
}

}  // namespace bottle
