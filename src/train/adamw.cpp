#include "train/adamw.h"

namespace bottle {

AdamW::AdamW(const ParameterStore& params, const AdamWConfig& config) : config_(config) {
  m_ = arena_.alloc({params.count()});
  v_ = arena_.alloc({params.count()});
}

void AdamW::step(Backend& be, const ParameterStore& params, float lr, float grad_scale) {
  ++step_;
  AdamWArgs args;
  args.lr = lr;
  args.beta1 = config_.beta1;
  args.beta2 = config_.beta2;
  args.eps = config_.eps;
  args.grad_scale = grad_scale;
  args.step = step_;
  for (size_t i = 0; i < params.specs().size(); ++i) {
    const ParamSpec& spec = params.specs()[i];
    const Param p = params.at(i);
    args.weight_decay = spec.weight_decay ? config_.weight_decay : 0.0f;
    const Tensor m{m_.f32() + spec.offset, spec.shape}, v{v_.f32() + spec.offset, spec.shape};
    be.adamw_update(p.value, p.grad, m, v, args);
  }
}

}  // namespace bottle
