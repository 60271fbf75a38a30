#include "nn/linear.h"

namespace bottle {

void linear_forward(Backend& be, Tensor y, Tensor x, Tensor w, Tensor residual) {
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
  add_residual(g, residual, y);
  g.dtypes_of(x, w, y);
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
  const int64_t n = x.rows(), in = x.cols(), out = w.rows();
  if (!dx.empty()) {
    GemmArgs g;  // dx[N,in] += dy[N,out] · W[out,in]
    g.m = n, g.n = in, g.k = out;
    g.a = dy.data, g.lda = out;
    g.b = w.data, g.ldb = in;
    g.c = dx.data, g.ldc = in;
    g.beta = accumulate_dx ? 1.0f : 0.0f;
    g.dtypes_of(dy, w, dx);
    be.gemm(g);
  }
  GemmArgs g;  // dW[out,in] += dyᵀ[out,N] · x[N,in]
  g.trans_a = true;
  g.m = out, g.n = in, g.k = n;
  g.a = dy.data, g.lda = out;
  g.b = x.data, g.ldb = in;
  g.c = dw.data, g.ldc = in;
  g.beta = 1.0f;
  g.dtypes_of(dy, x, dw);
  be.gemm(g);
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

}  // namespace bottle
