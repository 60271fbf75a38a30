#include "nn/linear.h"

namespace bottle {

namespace {

// y[N,out] = x[N,in] · Wᵀ, checked.
GemmArgs forward_args(Tensor y, Tensor x, Tensor w) {
  const int64_t n = x.rows(), in = x.cols(), out = w.rows();
  BOTTLE_ASSERT(w.cols() == in && y.cols() == out && y.rows() == n,
                "linear_forward: x {} · W{}ᵀ does not give y {}", x.shape.str(), w.shape.str(),
                y.shape.str());
  GemmArgs g;
  g.trans_b = true;
  g.m = n, g.n = out, g.k = in;
  g.a = x.data, g.lda = in;
  g.b = w.data, g.ldb = in;
  g.c = y.data, g.ldc = out;
  g.dtypes_of(x, w, y);
  return g;
}

// dx[N,in] = beta · dx + dy[N,out] · W[out,in].
void input_gradient(Backend& be, Tensor dx, Tensor dy, Tensor w, float beta) {
  const int64_t n = dy.rows(), in = w.cols(), out = w.rows();
  GemmArgs g;
  g.m = n, g.n = in, g.k = out;
  g.a = dy.data, g.lda = out;
  g.b = w.data, g.ldb = in;
  g.c = dx.data, g.ldc = in;
  g.beta = beta;
  g.dtypes_of(dy, w, dx);
  be.gemm(g);
}

// dW[out,in] += dyᵀ[out,N] · x[N,in].
GemmArgs weight_gradient_args(Tensor dw, Tensor dy, Tensor x) {
  const int64_t n = x.rows(), in = x.cols(), out = dy.cols();
  GemmArgs g;
  g.trans_a = true;
  g.m = out, g.n = in, g.k = n;
  g.a = dy.data, g.lda = out;
  g.b = x.data, g.ldb = in;
  g.c = dw.data, g.ldc = in;
  g.beta = 1.0f;
  g.dtypes_of(dy, x, dw);
  return g;
}

// Calls run(begin, end) for each run [begin, end) of members whose weights have equal shapes.
template <typename Run>
void for_equal_weights(std::span<const Tensor> ws, Run run) {
  size_t i = 0;
  while (i < ws.size()) {
    size_t j = i + 1;
    while (j < ws.size() && ws[j].shape == ws[i].shape && ws[j].dtype == ws[i].dtype) ++j;
    run(i, j);
    i = j;
  }
}

}  // namespace

void linear_forward(Backend& be, Tensor y, Tensor x, Tensor w, Tensor residual) {
  GemmArgs g = forward_args(y, x, w);
  add_residual(g, residual, y);
  be.gemm(g);
}

void add_residual(GemmArgs& g, Tensor residual, Tensor y) {
  if (residual.empty()) return;
  BOTTLE_ASSERT(residual.shape == y.shape && residual.dtype == y.dtype,
                "residual {} {} is not laid out like the output {} {}", dtype_name(residual.dtype),
                residual.shape.str(), dtype_name(y.dtype), y.shape.str());
  g.c_in = residual.data;
  g.beta = 1.0f;
}

void linear_backward(Backend& be, Tensor dx, Tensor dw, Tensor dy, Tensor x, Tensor w,
                     bool accumulate_dx) {
  linear_input_grad(be, dx, dy, w, accumulate_dx);
  linear_weight_grad(be, dw, dy, x);
}

void linear_input_grad(Backend& be, Tensor dx, Tensor dy, Tensor w, bool accumulate_dx) {
  if (!dx.empty()) input_gradient(be, dx, dy, w, accumulate_dx ? 1.0f : 0.0f);
}

void linear_weight_grad(Backend& be, Tensor dw, Tensor dy, Tensor x) {
  be.gemm(weight_gradient_args(dw, dy, x));
}

void gemm_grouped(Backend& be, GemmArgs shape, const std::vector<GemmOperands>& items) {
  // In elements of the operand's dtype.
  auto spacing = [](const void* x, const void* y, DType dtype) {
    return (static_cast<const char*>(y) - static_cast<const char*>(x)) / int64_t(dtype_size(dtype));
  };
  // Whether `count` outputs `sc` apart touch disjoint elements: whole [m, ldc] matrices one
  // after another, or column blocks side by side within one row of ldc (the interleaved
  // [N, Σr] latents a group's input gradients write). Anything else would race.
  auto disjoint = [&](int64_t sc, int64_t count) {
    return sc >= shape.m * shape.ldc || (sc >= shape.n && (count - 1) * sc + shape.n <= shape.ldc);
  };
  size_t i = 0;
  while (i < items.size()) {
    size_t j = i + 1;
    int64_t sa = 0, sb = 0, sc = 0;
    if (j < items.size()) {
      sa = spacing(items[i].a, items[j].a, shape.a_dtype);
      sb = spacing(items[i].b, items[j].b, shape.b_dtype);
      sc = spacing(items[i].c, items[j].c, shape.c_dtype);
      if (sa >= 0 && sb >= 0 && disjoint(sc, 2))
        while (j < items.size() && spacing(items[j - 1].a, items[j].a, shape.a_dtype) == sa &&
               spacing(items[j - 1].b, items[j].b, shape.b_dtype) == sb &&
               spacing(items[j - 1].c, items[j].c, shape.c_dtype) == sc &&
               disjoint(sc, int64_t(j - i + 1)))
          ++j;
      else
        j = i + 1;
    }
    GemmArgs g = shape;
    g.a = items[i].a, g.b = items[i].b, g.c = items[i].c;
    g.batch = int64_t(j - i);
    if (g.batch > 1) g.stride_a = sa, g.stride_b = sb, g.stride_c = sc;
    be.gemm(g);
    i = j;
  }
}

void linear_forward_shared_input(Backend& be, std::span<const Tensor> ys, Tensor x,
                                 std::span<const Tensor> ws) {
  BOTTLE_ASSERT(ys.size() == ws.size(), "linear_forward_shared_input: {} outputs for {} weights",
                ys.size(), ws.size());
  for_equal_weights(ws, [&](size_t begin, size_t end) {
    std::vector<GemmOperands> items;  // y_p[N,out] = x[N,in] · W_pᵀ
    for (size_t p = begin; p < end; ++p) {
      const GemmArgs g = forward_args(ys[p], x, ws[p]);
      items.push_back({g.a, g.b, g.c});
    }
    gemm_grouped(be, forward_args(ys[begin], x, ws[begin]), items);
  });
}

void linear_backward_shared_input(Backend& be, Tensor dx, std::span<const Tensor> dws,
                                  std::span<const Tensor> dys, Tensor x,
                                  std::span<const Tensor> ws) {
  BOTTLE_ASSERT(dws.size() == ws.size() && dys.size() == ws.size(),
                "linear_backward_shared_input: {} gradients and {} outputs for {} weights",
                dws.size(), dys.size(), ws.size());
  linear_input_grad_shared_input(be, dx, dys, ws);
  linear_weight_grad_shared_input(be, dws, dys, x);
}

void linear_input_grad_shared_input(Backend& be, Tensor dx, std::span<const Tensor> dys,
                                    std::span<const Tensor> ws) {
  // dx[N,in] = Σ_p dy_p[N,out_p] · W_p: the first member writes, the rest add.
  for (size_t p = 0; p < ws.size(); ++p) input_gradient(be, dx, dys[p], ws[p], p > 0 ? 1.0f : 0.0f);
}

void linear_weight_grad_shared_input(Backend& be, std::span<const Tensor> dws,
                                     std::span<const Tensor> dys, Tensor x) {
  // Runs of members whose weight gradients have equal shapes: one batched GEMM each.
  for_equal_weights(dws, [&](size_t begin, size_t end) {
    std::vector<GemmOperands> items;  // dW_p[out,in] += dy_pᵀ[out,N] · x[N,in]
    for (size_t p = begin; p < end; ++p) items.push_back({dys[p].data, x.data, dws[p].data});
    gemm_grouped(be, weight_gradient_args(dws[begin], dys[begin], x), items);
  });
}

}  // namespace bottle
