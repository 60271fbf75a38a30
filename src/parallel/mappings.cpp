#include "parallel/mappings.h"

namespace bottle {
namespace {

// out [N, C·t] = the ranks' in [N, C] side by side: gather's forward and scatter's backward.
TpTask all_gather_last_dim(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                           Tensor scratch, std::string_view site) {
  const int64_t n = in.rows(), c = in.cols(), t = tp.size();
  BOTTLE_ASSERT(out.rows() == n && out.cols() == c * t, "gather {}: [{}, {}] x {} ranks != {}",
                site, n, c, t, out.shape.str());
  if (t == 1) {
    be.copy(out, in);
    co_return;
  }
  BOTTLE_ASSERT(scratch.numel() >= t * n * c, "gather {}: scratch too small", site);
  Tensor blocks = scratch.view(0, {t * n * c});  // [t, N, C]: rank r's block r
  // (No braced list inside a co_await expression: g++ 12 cannot compile its array.)
  const Tensor flat_in = in.reshaped({n * c});
  co_await tp_all_gather(tp, blocks, flat_in, site);
  for (int64_t r = 0; r < t; ++r) be.copy_columns(out, r * c, blocks.view(r * n * c, {n, c}), 0, c);
}

// out [N, C] = this rank's columns of in [N, C·t]: scatter's forward and gather's backward.
void keep_own_columns(Backend& be, const TensorParallel& tp, Tensor out, Tensor in) {
  const int64_t n = out.rows(), c = out.cols();
  BOTTLE_ASSERT(in.rows() == n && in.cols() == c * tp.size(), "scatter: {} is not {} x [{}, {}]",
                in.shape.str(), tp.size(), n, c);
  be.copy_columns(out, 0, in, c * tp.rank(), c);
}

}  // namespace

void copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site) {
  if (tp.size() > 1) tp.comm->all_reduce(dx, ReduceOp::sum, site);
}

void reduce_from_forward(const TensorParallel& tp, Tensor y, std::string_view site) {
  if (tp.size() > 1) tp.comm->all_reduce(y, ReduceOp::sum, site);
}

CollectiveAwaiter co_copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site) {
  return tp_all_reduce(tp, dx, site);
}

CollectiveAwaiter co_reduce_from_forward(const TensorParallel& tp, Tensor y,
                                         std::string_view site) {
  return tp_all_reduce(tp, y, site);
}

void gather_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                             Tensor scratch, std::string_view site) {
  all_gather_last_dim(be, tp, out, in, scratch, site).get();
}

TpTask co_gather_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                                  Tensor scratch, std::string_view site) {
  return all_gather_last_dim(be, tp, out, in, scratch, site);
}

void gather_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy) {
  keep_own_columns(be, tp, dx, dy);
}

void scatter_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in) {
  keep_own_columns(be, tp, out, in);
}

void scatter_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy,
                               Tensor scratch, std::string_view site) {
  all_gather_last_dim(be, tp, dx, dy, scratch, site).get();
}

TpTask co_scatter_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy,
                                    Tensor scratch, std::string_view site) {
  return all_gather_last_dim(be, tp, dx, dy, scratch, site);
}

}  // namespace bottle
