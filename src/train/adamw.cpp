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
  // Parameters declared without weight decay, as ranges of this optimizer's share; adjacent
  // ones merge, so that the update's pass alternates between as few stretches as it can.
  for (const ParamSpec& spec : params.specs()) {
    if (spec.weight_decay) continue;
    const int64_t lo = std::max(spec.offset, begin_) - begin_,
                  hi = std::min(spec.offset + spec.shape.numel(), end_) - begin_;
    if (lo >= hi) continue;
    if (!no_decay_.empty() && no_decay_.back().offset + no_decay_.back().count == lo)
      no_decay_.back().count += hi - lo;
    else
      no_decay_.push_back({lo, hi - lo});
  }
}

void AdamW::step(Backend& be, const ParameterStore& params, float lr, Tensor control) {
  AdamWArgs args;
  args.lr = lr;
  args.beta1 = config_.beta1;
  args.beta2 = config_.beta2;
  args.eps = config_.eps;
  args.weight_decay = config_.weight_decay;
  args.step = step_ + 1;
  args.no_decay = no_decay_;
  const Shape range{end_ - begin_};
  const Tensor compute =
      params.mixed_precision() ? params.compute_values().view(begin_, range) : Tensor{};
  be.adamw_update(params.values().view(begin_, range), compute, params.grads().view(begin_, range),
                  m_, v_, control, args);
}

void AdamW::gather_moments(Tensor m_whole, Tensor v_whole, Communicator* dp) const {
  if (m_.numel() == m_whole.numel()) {
    arena_.backend().copy(m_whole, m_);
    arena_.backend().copy(v_whole, v_);
    return;
  }
  BOTTLE_ASSERT(dp && dp->size() * m_.numel() == m_whole.numel(),
                "AdamW: a ZeRO shard of {} elements does not tile {}", m_.numel(), m_whole.numel());
  dp->all_gather(m_whole, m_, "checkpoint.moments");
  dp->all_gather(v_whole, v_, "checkpoint.moments");
  // The caller reads them on the host next: a device group's calls end here, with its errors.
  dp->complete();
}

void AdamW::load_moments(Tensor m_whole, Tensor v_whole) {
  arena_.backend().copy(m_, m_whole.view(begin_, m_.shape));
  arena_.backend().copy(v_, v_whole.view(begin_, v_.shape));
}

}  // namespace bottle
