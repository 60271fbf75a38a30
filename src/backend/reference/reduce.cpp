// Sums over a whole tensor, in double and in index order.
#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

double ReferenceBackend::do_sum(Tensor x) {
  need_f32("sum", {x});
  double s = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) s += x.f32()[i];
  return s;
}

double ReferenceBackend::do_sum_squares(Tensor x) {
  need_f32("sum_squares", {x});
  double s = 0.0;
  for (int64_t i = 0; i < x.numel(); ++i) s += double(x.f32()[i]) * x.f32()[i];
  return s;
}

}  // namespace bottle
