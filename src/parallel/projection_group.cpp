#include "parallel/projection_group.h"

#include <vector>

#include "nn/linear.h"

namespace bottle {
namespace {

int64_t held(const Projection& p) { return p.shard_rank ? p.shard_rank : p.rank; }
int64_t held_offset(const Projection& p) { return p.sharded() ? p.shard_offset : 0; }
// Row stride of what A writes: z_shard when sharded, else z.
int64_t z_out_stride(const Projection& p) { return p.sharded() ? p.shard_rank : p.latent_stride(); }

// Runs one (batched) GEMM per run of consecutive members with the same GEMM shape (one member
// per run when grouping is off): make_shape(i) and make_item(i) give member i's.
template <typename MakeShape, typename MakeItem>
void for_runs(Backend& be, ProjectionSpan group, bool grouping, MakeShape make_shape,
              MakeItem make_item) {
  size_t i = 0;
  while (i < group.size()) {
    const GemmArgs shape = make_shape(i);
    std::vector<GemmOperands> items{make_item(i)};
    size_t j = i + 1;
    while (grouping && j < group.size()) {
      const GemmArgs other = make_shape(j);
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
  const Projection& front = *group.front();
  const Tensor& first = front.*field;
  int64_t total = 0;  // elements before member p (stacked), or its first column (interleaved)
  for (const Projection* p : group) {
    const Tensor& t = p->*field;
    if (p->ld != front.ld || t.data != first.at(total) || t.dtype != first.dtype) return {};
    total += front.interleaved() ? p->rank : t.numel();
  }
  if (!front.interleaved()) return Tensor{first.data, {total}, first.dtype, first.device};
  if (total != front.ld) return {};  // not the whole buffer
  return Tensor{first.data, {first.rows(), total}, first.dtype, first.device};
}

std::vector<Tensor> rows_of(ProjectionSpan group, Tensor Projection::*field) {
  if (const Tensor whole = flat(group, field); !whole.empty() && group.front()->interleaved())
    return {whole};
  std::vector<Tensor> members;
  for (const Projection* p : group) {
    BOTTLE_ASSERT(!p->interleaved(), "interleaved latents that are not one [N, Σr] buffer");
    members.push_back(p->*field);
  }
  return members;
}

namespace {

// The group's A's (`field`: their compute copies or their gradients) as one [Σr, d_in] matrix,
// where the latents are interleaved and the A's lie one after another (the model declares a
// group's A's in a row, each on a 128-element boundary: they touch where r·d_in is a multiple
// of 128), else empty.
Tensor stacked_A(ProjectionSpan group, Tensor Param::*field) {
  const Projection& front = *group.front();
  if (group.size() < 2 || !front.interleaved()) return {};
  const Tensor& first = front.A.*field;
  int64_t rows = 0;
  for (const Projection* p : group) {
    const Tensor& a = p->A.*field;
    if (a.data != first.at(rows * front.d_in) || a.cols() != front.d_in || a.dtype != first.dtype)
      return {};
    rows += a.rows();
  }
  return Tensor{first.data, {rows, front.d_in}, first.dtype, first.device};
}

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
  if (const Tensor a = grouping ? stacked_A(group, &Param::compute) : Tensor{}; !a.empty())
    return linear_forward(be, flat(group, &Projection::z), x, a);  // Z [N, Σr] = x [A_p]ᵀ
  for_runs(
      be, group, grouping,
      [&](size_t i) {
        const Projection& p = *group[i];
        GemmArgs g;
        g.trans_b = true;
        g.m = x.rows(), g.n = held(p), g.k = p.d_in;
        g.lda = p.d_in, g.ldb = p.d_in, g.ldc = z_out_stride(p);
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
      [&](size_t i) {
        const Projection& p = *group[i];
        GemmArgs g;
        g.trans_b = true;
        g.m = p.u.rows(), g.n = p.d_out, g.k = held(p);
        g.lda = p.latent_stride(), g.ldb = held(p), g.ldc = p.d_out;
        g.dtypes_of(p.u, p.B.compute, ys[0]);
        return g;
      },
      [&](size_t i) {
        Projection& p = *group[i];
        return GemmOperands{p.u.at(held_offset(p)), p.B.compute.data, ys[i].data};
      });
}

void group_up_input_grad(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                         std::span<const Tensor> partials, bool accumulate, bool grouping) {
  // Where member i's latent gradient goes, and that buffer's row stride.
  auto du_out = [&](size_t i) {
    const Projection& p = *group[i];
    if (!partials.empty()) return std::pair{partials[i], held(p)};
    if (p.sharded()) return std::pair{p.du_shard, p.shard_rank};
    return std::pair{p.du, p.latent_stride()};
  };
  for_runs(  // du = dy B
      be, group, grouping,
      [&](size_t i) {
        const Projection& p = *group[i];
        const auto [du, ldc] = du_out(i);
        GemmArgs g;
        g.m = p.u.rows(), g.n = held(p), g.k = p.d_out;
        g.lda = p.d_out, g.ldb = held(p), g.ldc = ldc;
        g.beta = accumulate ? 1.0f : 0.0f;
        g.dtypes_of(dys[i], p.B.compute, du);
        return g;
      },
      [&](size_t i) {
        return GemmOperands{dys[i].data, group[i]->B.compute.data, du_out(i).first.data};
      });
}

void group_up_weight_grad(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                          bool grouping) {
  for_runs(  // dB += dyᵀ u
      be, group, grouping,
      [&](size_t i) {
        const Projection& p = *group[i];
        GemmArgs g;
        g.trans_a = true;
        g.m = p.d_out, g.n = held(p), g.k = p.u.rows();
        g.lda = p.d_out, g.ldb = p.latent_stride(), g.ldc = held(p);
        g.beta = 1.0f;
        g.dtypes_of(dys[0], p.u, p.B.grad);
        return g;
      },
      [&](size_t i) {
        Projection& p = *group[i];
        return GemmOperands{dys[i].data, p.u.at(held_offset(p)), p.B.grad.data};
      });
}

void group_up_backward(Backend& be, ProjectionSpan group, std::span<const Tensor> dys,
                       std::span<const Tensor> partials, bool accumulate, bool grouping) {
  group_up_input_grad(be, group, dys, partials, accumulate, grouping);
  group_up_weight_grad(be, group, dys, grouping);
}

namespace {

// The group's A's and their gradients as one [Σr, d_in] matrix each (stacked_A), both or
// neither: the input and the weight gradient must take the same path.
std::pair<Tensor, Tensor> stacked_A_and_grad(ProjectionSpan group, bool grouping) {
  if (!grouping) return {};
  const Tensor a = stacked_A(group, &Param::compute), a_grad = stacked_A(group, &Param::grad);
  if (a.empty() || a_grad.empty()) return {};
  return {a, a_grad};
}

}  // namespace

void group_down_input_grad(Backend& be, ProjectionSpan group, Tensor dx, bool accumulate_dx,
                           bool grouping) {
  if (const auto [a, a_grad] = stacked_A_and_grad(group, grouping); !a.empty()) {
    // dx (+)= dZ [A_p] with k = Σr, one rounding.
    linear_input_grad(be, dx, flat(group, &Projection::dz), a, accumulate_dx);
    return;
  }
  // The members' input gradients add up, so they cannot be one batched GEMM.
  for (size_t i = 0; i < group.size(); ++i) {
    const Projection& p = *group[i];
    GemmArgs g;
    g.m = dx.rows(), g.n = p.d_in, g.k = held(p);
    g.a = p.dz.at(held_offset(p)), g.lda = p.latent_stride();
    g.b = p.A.compute.data, g.ldb = p.d_in;
    g.c = dx.data, g.ldc = p.d_in;
    g.beta = accumulate_dx || i > 0 ? 1.0f : 0.0f;
    g.dtypes_of(p.dz, p.A.compute, dx);
    be.gemm(g);
  }
}

void group_down_weight_grad(Backend& be, ProjectionSpan group, Tensor x, bool grouping) {
  if (const auto [a, a_grad] = stacked_A_and_grad(group, grouping); !a.empty()) {
    linear_weight_grad(be, a_grad, flat(group, &Projection::dz), x);  // [dA_p] += dZᵀ x
  } else {
    for_runs(  // dA += dzᵀ x
        be, group, grouping,
        [&](size_t i) {
          const Projection& p = *group[i];
          GemmArgs g;
          g.trans_a = true;
          g.m = held(p), g.n = p.d_in, g.k = x.rows();
          g.lda = p.latent_stride(), g.ldb = p.d_in, g.ldc = p.d_in;
          g.beta = 1.0f;
          g.dtypes_of(p.dz, x, p.A.grad);
          return g;
        },
        [&](size_t i) {
          Projection& p = *group[i];
          return GemmOperands{p.dz.at(held_offset(p)), x.data, p.A.grad.data};
        });
  }
  // After dA, which reads dz (svd: dz is du).
  for (Projection* p : group)
    if (p->shares_du()) be.fill_zero(p->du);
}

void group_down_backward(Backend& be, ProjectionSpan group, Tensor dx, Tensor x, bool accumulate_dx,
                         bool grouping) {
  group_down_input_grad(be, group, dx, accumulate_dx, grouping);
  group_down_weight_grad(be, group, x, grouping);
}

}  // namespace bottle
