#include "parallel/projection_group.h"

#include <vector>

#include "nn/linear.h"

namespace bottle {
namespace {

int64_t held(const Projection& p) { return p.shard_rank ? p.shard_rank : p.rank; }
int64_t held_offset(const Projection& p) { return p.sharded() ? p.shard_offset : 0; }

// Runs `issue(shape, items)` once per run of consecutive members with the same GEMM shape
// (one member per run when grouping is off).
template <typename MakeShape, typename MakeItem>
void for_runs(Backend& be, ProjectionSpan group, bool grouping, MakeShape make_shape,
              MakeItem make_item) {
  size_t i = 0;
  while (i < group.size()) {
    const GemmArgs shape = make_shape(*group[i]);
    std::vector<GemmOperands> items{make_item(i)};
    size_t j = i + 1;
    while (grouping && j < group.size()) {
      const GemmArgs other = make_shape(*group[j]);
      if (other.m != shape.m || other.n != shape.n || other.k != shape.k ||
          other.lda != shape.lda || other.ldb != shape.ldb || other.ldc != shape.ldc)
        break;
      items.push_back(make_item(j++));
    }
    gemm_grouped(be, shape, items);
    i = j;
  }
}

}  // namespace

Tensor flat(ProjectionSpan group, Tensor Projection::*field) {
  const Tensor& first = group.front()->*field;
  int64_t total = 0;
  for (const Projection* p : group) {
    const Tensor& t = p->*field;
    if (t.data != first.at(total) || t.dtype != first.dtype) return {};
    total += t.numel();
  }
  return Tensor{first.data, {total}, first.dtype, first.device};
}

namespace {

// Whether the group's latent stage is σ alone on every member, in one pass over its slabs.
bool one_sigma(ProjectionSpan group) {
  if (group.size() < 2) return false;
  for (const Projection* p : group)
    if (p->kind != BottleneckKind::cola || p->crossing) return false;
  return !flat(group, &Projection::z).empty() && !flat(group, &Projection::u).empty() &&
         !flat(group, &Projection::du).empty() && !flat(group, &Projection::dz).empty();
}

}  // namespace

void group_latent_forward(Backend& be, ProjectionSpan group, std::span<const Tensor> u_prevs) {
  if (one_sigma(group))
    return be.silu_forward(flat(group, &Projection::u), flat(group, &Projection::z));
  for (size_t i = 0; i < group.size(); ++i) group[i]->latent_forward(be, u_prevs[i]);
}

void group_latent_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> u_prevs,
                           std::span<const Tensor> du_prevs) {
  if (one_sigma(group)) {
    return be.silu_backward(flat(group, &Projection::dz), flat(group, &Projection::du),
                            flat(group, &Projection::z));
  }
  for (size_t i = 0; i < group.size(); ++i) group[i]->latent_backward(be, u_prevs[i], du_prevs[i]);
}

void group_down_forward(Backend& be, ProjectionSpan group, Tensor x, bool grouping) {
  for_runs(
      be, group, grouping,
      [&](const Projection& p) {
        GemmArgs g;
        g.trans_b = true;
        g.m = x.rows(), g.n = held(p), g.k = p.d_in;
        g.lda = p.d_in, g.ldb = p.d_in, g.ldc = held(p);
        g.dtypes_of(x, p.A.compute, p.z);
        return g;
      },
      [&](size_t i) {
        Projection& p = *group[i];
        return GemmOperands{x.data, p.A.compute.data, (p.sharded() ? p.z_shard : p.z).data};
      });
}

void group_up_forward(Backend& be, ProjectionSpan group, std::span<const Tensor> ys,
                      bool grouping) {
  for_runs(
      be, group, grouping,
      [&](const Projection& p) {
        GemmArgs g;
        g.trans_b = true;
        g.m = p.u.rows(), g.n = p.d_out, g.k = held(p);
        g.lda = p.rank, g.ldb = held(p), g.ldc = p.d_out;
        g.dtypes_of(p.u, p.B.compute, ys[0]);
        return g;
      },
      [&](size_t i) {
        Projection& p = *group[i];
        return GemmOperands{p.u.at(held_offset(p)), p.B.compute.data, ys[i].data};
      });
}

void group_up_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                       std::span<const Tensor> du_out, bool accumulate, bool grouping) {
  for_runs(  // du = dy B
      be, group, grouping,
      [&](const Projection& p) {
        GemmArgs g;
        g.m = p.u.rows(), g.n = held(p), g.k = p.d_out;
        g.lda = p.d_out, g.ldb = held(p), g.ldc = held(p);
        g.beta = accumulate ? 1.0f : 0.0f;
        g.dtypes_of(dys[0], p.B.compute, du_out[0]);
        return g;
      },
      [&](size_t i) {
        return GemmOperands{dys[i].data, group[i]->B.compute.data, du_out[i].data};
      });
  for_runs(  // dB += dyᵀ u
      be, group, grouping,
      [&](const Projection& p) {
        GemmArgs g;
        g.trans_a = true;
        g.m = p.d_out, g.n = held(p), g.k = p.u.rows();
        g.lda = p.d_out, g.ldb = p.rank, g.ldc = held(p);
        g.beta = 1.0f;
        g.dtypes_of(dys[0], p.u, p.B.grad);
        return g;
      },
      [&](size_t i) {
        Projection& p = *group[i];
        return GemmOperands{dys[i].data, p.u.at(held_offset(p)), p.B.grad.data};
      });
}

void group_down_backward(Backend& be, ProjectionSpan group, Tensor dx, Tensor x, bool accumulate_dx,
                         bool grouping) {
  // The input gradients add up, so they cannot be one batched GEMM.
  for (size_t i = 0; i < group.size(); ++i) {
    const Projection& p = *group[i];
    GemmArgs g;
    g.m = x.rows(), g.n = p.d_in, g.k = held(p);
    g.a = p.dz.at(held_offset(p)), g.lda = p.rank;
    g.b = p.A.compute.data, g.ldb = p.d_in;
    g.c = dx.data, g.ldc = p.d_in;
    g.beta = accumulate_dx || i > 0 ? 1.0f : 0.0f;
    g.dtypes_of(p.dz, p.A.compute, dx);
    be.gemm(g);
  }
  for_runs(  // dA += dzᵀ x
      be, group, grouping,
      [&](const Projection& p) {
        GemmArgs g;
        g.trans_a = true;
        g.m = held(p), g.n = p.d_in, g.k = x.rows();
        g.lda = p.rank, g.ldb = p.d_in, g.ldc = p.d_in;
        g.beta = 1.0f;
        g.dtypes_of(p.dz, x, p.A.grad);
        return g;
      },
      [&](size_t i) {
        Projection& p = *group[i];
        return GemmOperands{p.dz.at(held_offset(p)), x.data, p.A.grad.data};
      });
  for (Projection* p : group)
    if (p->shares_du()) be.fill_zero(p->du);
}

}  // namespace bottle
