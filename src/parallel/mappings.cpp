#include "parallel/mappings.h"

#include <cstring>

namespace bottle {

void copy_to_backward(const TensorParallel& tp, Tensor dx, std::string_view site) {
  if (tp.size() > 1) tp.comm->all_reduce(dx, ReduceOp::sum, site);
}

void reduce_from_forward(const TensorParallel& tp, Tensor y, std::string_view site) {
  if (tp.size() > 1) tp.comm->all_reduce(y, ReduceOp::sum, site);
}

void gather_last_dim(const TensorParallel& tp, Tensor out, Tensor in, Tensor scratch,
                     std::string_view site) {
  const int64_t n = in.rows(), c = in.cols(), t = tp.size();
  BOTTLE_CHECK(out.rows() == n && out.cols() == c * t, "gather {}: [{}, {}] x {} ranks != {}", site,
               n, c, t, out.shape.str());
  if (t == 1) {
    std::memcpy(out.data, in.data, in.nbytes());
    return;
  }
  BOTTLE_CHECK(scratch.numel() >= t * n * c, "gather {}: scratch too small", site);
  Tensor blocks{scratch.data, {t * n * c}};
  tp.comm->all_gather(blocks, Tensor{in.data, {n * c}}, site);
  // [t, N, C] → [N, t·C]
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    for (int64_t r = 0; r < t; ++r)
      std::memcpy(out.f32() + i * c * t + r * c, blocks.f32() + (r * n + i) * c, c * sizeof(float));
}

void scatter_last_dim(const TensorParallel& tp, Tensor out, Tensor in) {
  const int64_t n = out.rows(), c = out.cols();
  BOTTLE_CHECK(in.rows() == n && in.cols() == c * tp.size(), "scatter: {} is not {} x [{}, {}]",
               in.shape.str(), tp.size(), n, c);
  const float* src = in.f32() + c * tp.rank();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(out.f32() + i * c, src + i * in.cols(), c * sizeof(float));
}

}  // namespace bottle
