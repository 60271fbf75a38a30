#include "parallel/mappings.h"

namespace bottle {
namespace {

// out [N, C·t] = the ranks' in [N, C] side by side: gather's forward and scatter's backward.
void all_gather_last_dim(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                         Tensor scratch, std::string_view site) {
  const int64_t n = in.rows(), c = in.cols(), t = tp.size();
  BOTTLE_ASSERT(out.rows() == n && out.cols() == c * t, "gather {}: [{}, {}] x {} ranks != {}",
                site, n, c, t, out.shape.str());
  if (t == 1) {
    be.copy(out, in);
    return;
  }
  BOTTLE_ASSERT(scratch.numel() >= t * n * c, "gather {}: scratch too small", site);
  Tensor blocks = scratch.view(0, {t * n * c});  // [t, N, C]: rank r's block r
  tp.comm->all_gather(blocks, in.reshaped({n * c}), site);
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

void gather_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in,
                             Tensor scratch, std::string_view site) {
  all_gather_last_dim(be, tp, out, in, scratch, site);
}

void gather_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy) {
  keep_own_columns(be, tp, dx, dy);
}

void scatter_last_dim_forward(Backend& be, const TensorParallel& tp, Tensor out, Tensor in) {
  keep_own_columns(be, tp, out, in);
}

void scatter_last_dim_backward(Backend& be, const TensorParallel& tp, Tensor dx, Tensor dy,
                               Tensor scratch, std::string_view site) {
  all_gather_last_dim(be, tp, dx, dy, scratch, site);
}

}  // namespace bottle
