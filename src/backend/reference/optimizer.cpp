// The optimizers' element-wise updates: AdamW with decoupled weight decay on fp32 masters,
// gradients and moments, in double; Muon's momentum, normalisation and update.
#include <algorithm>
#include <cmath>

#include "backend/reference/common.h"
#include "backend/reference_backend.h"
#include "core/bf16.h"

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

void ReferenceBackend::do_muon_momentum(Tensor update, Tensor buffer, Tensor grad, Tensor control,
                                        const MuonArgs& a) {
  const bool apply = control.empty() || control.f32()[kControlApply] != 0.0f;
  const double scale = control.empty() ? a.grad_scale : control.f32()[kControlScale];
  for (int64_t i = 0; i < grad.numel(); ++i) {
    const double g = double(grad.f32()[i]) * scale;
    const double b = double(a.momentum) * buffer.f32()[i] + g;
    update.f32()[i] = float(a.nesterov ? g + double(a.momentum) * b : b);
    if (apply) buffer.f32()[i] = float(b);
  }
}

void ReferenceBackend::do_muon_normalize(Tensor x, Tensor sumsq) {
  const double inverse = 1.0 / std::max(std::sqrt(double(sumsq.f32()[0])), 1e-7);
  for (int64_t i = 0; i < x.numel(); ++i) x.f32()[i] = float(x.f32()[i] * inverse);
}

void ReferenceBackend::do_muon_apply(Tensor param, Tensor compute, Tensor update, Tensor control,
                                     const MuonArgs& a) {
  if (!control.empty() && control.f32()[kControlApply] == 0.0f) return;
  const double decay = 1.0 - double(a.lr) * a.weight_decay, step = double(a.lr) * a.adjust;
  for (int64_t i = 0; i < param.numel(); ++i) {
    param.f32()[i] = float(param.f32()[i] * decay - step * update.f32()[i]);
    if (compute.empty()) continue;
    if (compute.dtype == DType::bf16)
      compute.bf16()[i] = bf16_from_float(param.f32()[i]);
    else
      compute.f32()[i] = param.f32()[i];
  }
}

}  // namespace bottle
