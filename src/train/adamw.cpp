#include "train/adamw.h"

#include <algorithm>

namespace bottle {

AdamW::AdamW(const ParameterStore& params, const AdamWConfig& config, ShardLayout shard)
    : config_(config),
      shard_(shard.pieces.empty()
                 ? ShardLayout::cut(params.padded(), std::max<int64_t>(1, params.padded()))
                 : std::move(shard)),
      backend_(&params.backend()),
      arena_(MemoryTag::optimizer, params.backend()) {
  m_ = arena_.alloc({shard_.count});
  v_ = arena_.alloc({shard_.count});
  int64_t local = 0;
  for (const ElementRange& flat : shard_.ranges()) {
    Part& part = parts_.emplace_back(Part{flat, local, {}});
    local += flat.count;
    // Parameters declared without weight decay, as ranges of this stretch; adjacent ones
    // merge, so that the update's pass alternates between as few stretches as it can.
    const int64_t begin = flat.offset, end = flat.offset + flat.count;
    for (const ParamSpec& spec : params.specs()) {
      if (spec.weight_decay) continue;
      const int64_t lo = std::max(spec.offset, begin) - begin,
                    hi = std::min(spec.offset + spec.shape.numel(), end) - begin;
      if (lo >= hi) continue;
      std::vector<ElementRange>& no_decay = part.no_decay;
      if (!no_decay.empty() && no_decay.back().offset + no_decay.back().count == lo)
        no_decay.back().count += hi - lo;
      else
        no_decay.push_back({lo, hi - lo});
    }
  }
}

void AdamW::step(Backend& be, const ParameterStore& params, float lr, Tensor control,
                 Tensor grad_shard) {
  AdamWArgs args;
  args.lr = lr;
  args.beta1 = config_.beta1;
  args.beta2 = config_.beta2;
  args.eps = config_.eps;
  args.weight_decay = config_.weight_decay;
  args.step = step_ + 1;
  // Element-wise: one pass per owned stretch gives the bits one pass over them all would.
  // Under ZeRO-3 the values are the owned stretches end to end, as the moments are, and the
  // compute copies are cast where the units are gathered.
  const bool sharded = params.value_slots();
  for (const Part& part : parts_) {
    args.no_decay = part.no_decay;
    const ElementRange& r = part.flat;
    const Shape range{r.count};
    const Tensor compute = params.mixed_precision() && !sharded
                               ? params.compute_values().view(r.offset, range)
                               : Tensor{};
    const Tensor grads = grad_shard.empty() ? params.grads().view(r.offset, range)
                                            : grad_shard.view(part.local, range);
    const Tensor values = params.values().view(sharded ? part.local : r.offset, range);
    be.adamw_update(values, compute, grads, m_.view(part.local, range), v_.view(part.local, range),
                    control, args);
  }
}

std::vector<FlatSource> AdamW::held_state() const {
  return {{"exp_avg/", m_, shard_.pieces}, {"exp_avg_sq/", v_, shard_.pieces}};
}

void AdamW::load_moments(Tensor m_whole, Tensor v_whole) {
  Backend& be = *backend_;
  shard_.take(be, m_, m_whole);
  shard_.take(be, v_, v_whole);
}

}  // namespace bottle
