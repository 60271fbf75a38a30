// AdamW with decoupled weight decay on fp32 masters, gradients and moments, in double.
#include <cmath>

#include "core/bf16.h"
#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

void ReferenceBackend::do_adamw_update(Tensor param, Tensor compute, Tensor grad, Tensor m,
                                       Tensor v, Tensor control, const AdamWArgs& a) {
  if (!control.empty() && control.f32()[kControlApply] == 0.0f) return;
  const double scale = control.empty() ? a.grad_scale : control.f32()[kControlScale];
  const double b1 = a.beta1, b2 = a.beta2;
  const double c1 = 1.0 - std::pow(b1, double(a.step));
  const double c2 = 1.0 - std::pow(b2, double(a.step));
  size_t range = 0;  // the first no-decay range not yet passed
  for (int64_t i = 0; i < param.numel(); ++i) {
    while (range < a.no_decay.size() && i >= a.no_decay[range].offset + a.no_decay[range].count)
      ++range;
    const bool decays = range == a.no_decay.size() || i < a.no_decay[range].offset;
    const double g = double(grad.f32()[i]) * scale;
    const double mi = b1 * m.f32()[i] + (1.0 - b1) * g;
    const double vi = b2 * v.f32()[i] + (1.0 - b2) * g * g;
    m.f32()[i] = float(mi);
    v.f32()[i] = float(vi);
    const double mhat = mi / c1, vhat = vi / c2;
    const double p = param.f32()[i], wd = decays ? double(a.weight_decay) : 0.0;
    param.f32()[i] = float(p - double(a.lr) * (mhat / (std::sqrt(vhat) + a.eps) + wd * p));
    if (compute.empty()) continue;
    if (compute.dtype == DType::bf16)
      compute.bf16()[i] = bf16_from_float(param.f32()[i]);
    else
      compute.f32()[i] = param.f32()[i];
  }
}

}  // namespace bottle
