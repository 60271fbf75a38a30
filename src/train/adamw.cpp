#include "train/adamw.h"

#include <algorithm>

namespace bottle {

AdamW::AdamW(const ParameterStore& params, const AdamWConfig& config, int64_t begin, int64_t end)
    : config_(config),
      begin_(begin),
      end_(end < 0 ? params.values().numel() : end),
      arena_(MemoryTag::optimizer, params.backend()) {
  m_ = arena_.alloc({end_ - begin_});
  v_ = arena_.alloc({end_ - begin_});
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
    // The part of this parameter inside the range.
    const int64_t lo = std::max(spec.offset, begin_);
    const int64_t hi = std::min(spec.offset + spec.shape.numel(), end_);
    if (lo >= hi) continue;
    args.weight_decay = spec.weight_decay ? config_.weight_decay : 0.0f;
    const Shape part{hi - lo};
    be.adamw_update(params.values().view(lo, part), params.grads().view(lo, part),
                    m_.view(lo - begin_, part), v_.view(lo - begin_, part), args);
  }
}

void AdamW::gather_moments(Tensor m_whole, Tensor v_whole, Communicator* dp) const {
  if (m_.numel() == m_whole.numel()) {
    arena_.backend().copy(m_whole, m_);
    arena_.backend().copy(v_whole, v_);
    return;
  }
  BOTTLE_CHECK(dp && dp->size() * m_.numel() == m_whole.numel(),
               "AdamW: a ZeRO shard of {} elements does not tile {}", m_.numel(), m_whole.numel());
  dp->all_gather(m_whole, m_, "checkpoint.moments");
  dp->all_gather(v_whole, v_, "checkpoint.moments");
}

void AdamW::load_moments(Tensor m_whole, Tensor v_whole) {
  arena_.backend().copy(m_, m_whole.view(begin_, m_.shape));
  arena_.backend().copy(v_, v_whole.view(begin_, v_.shape));
}

}  // namespace bottle
