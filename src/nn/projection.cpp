#include "nn/projection.h"

#include "nn/linear.h"

namespace bottle {
namespace {

// y[N, out] = x[:, offset : offset + W.cols] · Wᵀ (+ residual), x with row stride ldx.
void strided_forward(Backend& be, Tensor y, Tensor x, int64_t offset, Tensor w, Tensor residual) {
  GemmArgs g;
  g.trans_b = true;
  g.m = x.rows(), g.n = w.rows(), g.k = w.cols();
  g.a = x.at(offset), g.lda = x.cols();
  g.b = w.data, g.ldb = w.cols();
  g.c = y.data, g.ldc = y.cols();
  add_residual(g, residual, y);
  g.dtypes_of(x, w, y);
  be.gemm(g);
}

// dx[N, in] (+)= dy[:, offset : offset + W.rows] · W and dW += that slice of dyᵀ · x.
void strided_backward(Backend& be, Tensor dx, Tensor dw, Tensor dy, int64_t offset, Tensor x,
                      Tensor w, bool accumulate_dx) {
  const int64_t n = x.rows(), in = x.cols(), out = w.rows();
  if (!dx.empty()) {
    GemmArgs g;
    g.m = n, g.n = in, g.k = out;
    g.a = dy.at(offset), g.lda = dy.cols();
    g.b = w.data, g.ldb = in;
    g.c = dx.data, g.ldc = in;
    g.beta = accumulate_dx ? 1.0f : 0.0f;
    g.dtypes_of(dy, w, dx);
    be.gemm(g);
  }
  GemmArgs g;
  g.trans_a = true;
  g.m = out, g.n = in, g.k = n;
  g.a = dy.at(offset), g.lda = dy.cols();
  g.b = x.data, g.ldb = in;
  g.c = dw.data, g.ldc = in;
  g.beta = 1.0f;
  g.dtypes_of(dy, x, dw);
  be.gemm(g);
}

}  // namespace

const char* bottleneck_kind_name(BottleneckKind kind) { return kBottleneckKindNames[int(kind)]; }

BottleneckKind parse_bottleneck_kind(const std::string& name) {
  if (name == "none") return BottleneckKind::none;
  if (name == "svd") return BottleneckKind::svd;
  if (name == "cola") return BottleneckKind::cola;
  if (name == "lax") return BottleneckKind::lax;
  fail("unknown bottleneck kind '{}' (expected none, svd, cola or lax)", name);
}

namespace {

// The buffers every bottleneck projection has besides z, u, du, dz.
void allocate_private(Projection& p, const ProjectionAllocators& from, int64_t rows) {
  if (p.sharded()) {
    p.z_shard = from.inside.alloc_act({rows, p.shard_rank});
    p.du_shard = from.grads.alloc_act({rows, p.shard_rank});
  }
  if (p.crossing) {
    p.zc = from.inside.alloc_act({rows, p.rank});
    p.zn = from.inside.alloc_act({rows, p.rank});
    p.ln_mean = from.inside.alloc({rows});
    p.ln_rstd = from.inside.alloc({rows});
    p.dzn = from.grads.alloc_act({rows, p.rank});
  }
}

// The stages below see z, u, du and dz as contiguous [N, rank]; interleaved ones are a group's
// columns, which only parallel/projection_group.h walks.
void require_own_latents(const Projection& p) {
  BOTTLE_ASSERT(!p.interleaved(),
                "a projection whose latents are a group's interleaved columns runs with its group");
}

}  // namespace

void Projection::allocate_activations(const ProjectionAllocators& from, int64_t rows) {
  if (!bottleneck()) return;
  if (shard_rank == 0) shard_rank = rank;
  ld = 0;
  z = from.z.alloc_act({rows, rank});
  du = from.du.alloc_act({rows, rank});
  if (kind == BottleneckKind::svd) {
    u = z;
    dz = du;
  } else {
    u = from.u.alloc_act({rows, rank});
    dz = from.grads.alloc_act({rows, rank});
  }
  allocate_private(*this, from, rows);
}

ProjectionSlabs allocate_grouped_activations(const ProjectionAllocators& from, int64_t rows,
                                             std::span<Projection* const> group,
                                             LatentLayout layout, int64_t z_tail) {
  int64_t width = 0;  // Σr
  for (Projection* p : group) {
    BOTTLE_ASSERT(p->bottleneck(), "grouped activations need bottleneck projections");
    BOTTLE_ASSERT(layout == LatentLayout::stacked || (!p->crossing && !p->sharded()),
                  "interleaved latents are for projections without a crossing, not sharded");
    if (p->shard_rank == 0) p->shard_rank = p->rank;
    width += p->rank;
  }
  const int64_t total = rows * width;
  ProjectionSlabs slabs;
  slabs.z = from.z.alloc_act({total + z_tail});
  slabs.du = from.du.alloc_act({total});
  const bool svd = group.front()->kind == BottleneckKind::svd;
  Tensor u_slab = svd ? slabs.z : from.u.alloc_act({total});
  Tensor dz_slab = svd ? slabs.du : from.grads.alloc_act({total});
  const bool interleaved = layout == LatentLayout::interleaved;
  int64_t offset = 0;  // of the member's first element: its first column, or its first row
  for (Projection* p : group) {
    p->ld = interleaved ? width : 0;
    // Interleaved, a member's [N, r_p] view starts at its first column and is read with row
    // stride Σr (latent_stride()): its last row ends inside the slab too.
    auto view = [&](Tensor slab) { return slab.view(offset, {rows, p->rank}); };
    p->z = view(slabs.z);
    p->du = view(slabs.du);
    p->u = view(u_slab);
    p->dz = view(dz_slab);
    offset += interleaved ? p->rank : rows * p->rank;
    allocate_private(*p, from, rows);
  }
  return slabs;
}

void Projection::forward(Backend& be, Tensor y, Tensor x, Tensor u_prev, Tensor residual) {
  if (!bottleneck()) return linear_forward(be, y, x, weight.compute, residual);
  BOTTLE_ASSERT(!sharded(), "a sharded projection needs its latent gathered between stages");
  down_forward(be, x);
  latent_forward(be, u_prev);
  up_forward(be, y, residual);
}

void Projection::backward(Backend& be, Tensor dx, Tensor dy, Tensor x, Tensor u_prev,
                          Tensor du_prev, bool accumulate_dx) {
  if (!bottleneck())
    return linear_backward(be, dx, weight.grad, dy, x, weight.compute, accumulate_dx);
  up_backward(be, dy);
  latent_backward(be, u_prev, du_prev);
  down_backward(be, dx, x, accumulate_dx);
}

void Projection::down_forward(Backend& be, Tensor x) {
  require_own_latents(*this);
  linear_forward(be, sharded() ? z_shard : z, x, A.compute);
}

void Projection::latent_forward(Backend& be, Tensor u_prev) {
  if (kind == BottleneckKind::svd) return;
  require_own_latents(*this);
  Tensor pre = z;
  if (crossing) {
    BOTTLE_ASSERT(!u_prev.empty(),
                  "lax projection with a crossing needs the previous block's latent");
    linear_forward(be, zc, u_prev, G.compute);  // zc = u_prev Gᵀ
    be.accumulate(zc, z);                       // zc += z
    be.layernorm_forward(zn, ln_mean, ln_rstd, zc, ln_w.value, ln_b.value, ln_eps);
    pre = zn;
  }
  be.silu_forward(u, pre);
}

void Projection::up_forward(Backend& be, Tensor y, Tensor residual) {
  require_own_latents(*this);
  strided_forward(be, y, u, sharded() ? shard_offset : 0, B.compute, residual);
}

void Projection::up_backward(Backend& be, Tensor dy) {
  require_own_latents(*this);
  if (!sharded()) {
    linear_backward(be, du, B.grad, dy, u, B.compute, shares_du());  // du (+)= dy B; dB += dyᵀ u
    return;
  }
  GemmArgs g;  // du_shard = dy B
  g.m = dy.rows(), g.n = shard_rank, g.k = d_out;
  g.a = dy.data, g.lda = d_out;
  g.b = B.compute.data, g.ldb = shard_rank;
  g.c = du_shard.data, g.ldc = shard_rank;
  g.dtypes_of(dy, B.compute, du_shard);
  be.gemm(g);
  GemmArgs w;  // dB += dyᵀ u[:, shard]
  w.trans_a = true;
  w.m = d_out, w.n = shard_rank, w.k = dy.rows();
  w.a = dy.data, w.lda = d_out;
  w.b = u.at(shard_offset), w.ldb = rank;
  w.c = B.grad.data, w.ldc = shard_rank;
  w.beta = 1.0f;
  w.dtypes_of(dy, u, B.grad);
  be.gemm(w);
}

void Projection::latent_backward(Backend& be, Tensor u_prev, Tensor du_prev) {
  if (kind == BottleneckKind::svd) return;  // dz is du
  require_own_latents(*this);
  // dz and dzn have one producer each: the kernels write them.
  if (!crossing) {
    be.silu_backward(dz, du, z);
    return;
  }
  be.silu_backward(dzn, du, zn);
  be.layernorm_backward(dz, ln_w.grad, ln_b.grad, dzn, zc, ln_w.value, ln_mean, ln_rstd);
  linear_backward(be, du_prev, G.grad, dz, u_prev, G.compute);  // du_prev += dz G; dG += dzᵀ u_prev
}

void Projection::down_backward(Backend& be, Tensor dx, Tensor x, bool accumulate_dx) {
  require_own_latents(*this);
  strided_backward(be, dx, A.grad, dz, sharded() ? shard_offset : 0, x, A.compute, accumulate_dx);
  if (shares_du()) be.fill_zero(du);
}

}  // namespace bottle
