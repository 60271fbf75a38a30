#include "nn/projection.h"

#include "nn/linear.h"

namespace bottle {

const char* bottleneck_kind_name(BottleneckKind kind) { return kBottleneckKindNames[int(kind)]; }

BottleneckKind parse_bottleneck_kind(const std::string& name) {
  if (name == "none") return BottleneckKind::none;
  if (name == "svd") return BottleneckKind::svd;
  if (name == "cola") return BottleneckKind::cola;
  if (name == "lax") return BottleneckKind::lax;
  fail("unknown bottleneck kind '{}' (expected none, svd, cola or lax)", name);
}

void Projection::allocate_activations(Arena& arena, int64_t rows) {
  if (!bottleneck()) return;
  z = arena.alloc({rows, rank});
  du = arena.alloc({rows, rank});
  if (kind == BottleneckKind::svd) {
    u = z;
    dz = du;
    return;
  }
  u = arena.alloc({rows, rank});
  dz = arena.alloc({rows, rank});
  if (crossing) {
    zn = arena.alloc({rows, rank});
    dzn = arena.alloc({rows, rank});
    ln_mean = arena.alloc({rows});
    ln_rstd = arena.alloc({rows});
  }
}

void Projection::forward(Backend& be, Tensor y, Tensor x, Tensor u_prev, bool accumulate) {
  if (!bottleneck()) return linear_forward(be, y, x, weight.value, accumulate);
  down_forward(be, x);
  latent_forward(be, u_prev);
  up_forward(be, y, accumulate);
}

void Projection::backward(Backend& be, Tensor dx, Tensor dy, Tensor x, Tensor u_prev,
                          Tensor du_prev, bool accumulate_dx) {
  if (!bottleneck())
    return linear_backward(be, dx, weight.grad, dy, x, weight.value, accumulate_dx);
  up_backward(be, dy);
  latent_backward(be, u_prev, du_prev);
  down_backward(be, dx, x, accumulate_dx);
}

void Projection::down_forward(Backend& be, Tensor x) { linear_forward(be, z, x, A.value); }

void Projection::latent_forward(Backend& be, Tensor u_prev) {
  if (kind == BottleneckKind::svd) return;
  Tensor pre = z;
  if (crossing) {
    BOTTLE_CHECK(!u_prev.empty(),
                 "lax projection with a crossing needs the previous block's latent");
    linear_forward(be, z, u_prev, G.value, /*accumulate=*/true);  // z += u_prev Gᵀ
    be.layernorm_forward(zn, ln_mean, ln_rstd, z, ln_w.value, ln_b.value, ln_eps);
    pre = zn;
  }
  be.silu_forward(u, pre);
}

void Projection::up_forward(Backend& be, Tensor y, bool accumulate) {
  linear_forward(be, y, u, B.value, accumulate);
}

void Projection::up_backward(Backend& be, Tensor dy) {
  linear_backward(be, du, B.grad, dy, u, B.value);  // du += dy B; dB += dyᵀ u
}

void Projection::latent_backward(Backend& be, Tensor u_prev, Tensor du_prev) {
  if (kind == BottleneckKind::svd) return;  // dz is du
  be.fill_zero(dz);
  if (!crossing) {
    be.silu_backward(dz, du, z);
    return;
  }
  be.fill_zero(dzn);
  be.silu_backward(dzn, du, zn);
  be.layernorm_backward(dz, ln_w.grad, ln_b.grad, dzn, z, ln_w.value, ln_mean, ln_rstd);
  linear_backward(be, du_prev, G.grad, dz, u_prev, G.value);  // du_prev += dz G; dG += dzᵀ u_prev
}

void Projection::down_backward(Backend& be, Tensor dx, Tensor x, bool accumulate_dx) {
  linear_backward(be, dx, A.grad, dz, x, A.value, accumulate_dx);
  be.fill_zero(du);
}

}  // namespace bottle
