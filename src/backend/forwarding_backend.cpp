#include "backend/forwarding_backend.h"

#include <algorithm>

namespace bottle {

namespace {

// The traffic of the ops that touch part of a tensor (backend/backend_ops.def): copy_columns'
// columns, and as much of x as sum_squares_ranges' ranges cover.
Tensor columns(const Tensor& dst, int64_t cols) {
  return Tensor{nullptr, {dst.rows(), cols}, dst.dtype, dst.device};
}

Tensor summed(const Tensor& x, std::span<const SumRange> ranges) {
  int64_t n = 0;
  for (const SumRange& r : ranges) n += r.count;
  return x.view(0, {std::min(n, x.numel())});
}

}  // namespace

double causal_attention_flops(const Tensor& q) {
  const double B = double(q.shape[0]), S = double(q.shape[1]), H = double(q.shape[2]),
               hd = double(q.shape[3]);
  return 4.0 * B * H * hd * S * (S + 1.0) / 2.0;
}

template <>
int64_t ForwardingBackend::not_run<int64_t>() {
  return -1;
}
template <>
double ForwardingBackend::not_run<double>() {
  return 0.0;
}

#define BOTTLE_BACKEND_OP(ret, op, params, call, traffic)               \
  ret ForwardingBackend::do_##op params {                               \
    return forward<ret>(#op, traffic, [&] { return inner().op call; }); \
  }
#include "backend/backend_ops.def"

}  // namespace bottle
