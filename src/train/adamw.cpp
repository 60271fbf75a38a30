#include "train/adamw.h"

#include <algorithm>

namespace bottle {

namespace {

// The stretches of `shard` that hold parameters of `roles`, each at its place in the shard
// (ShardPiece's local); empty roles: the owned stretches whole.
std::vector<ShardPiece> routed_stretches(const ParameterStore& params, const ShardLayout& shard,
                                         const std::vector<ParamRole>& roles) {
  std::vector<ShardPiece> out;
  int64_t local = 0;
  for (const ElementRange& r : shard.ranges()) {
    if (roles.empty()) {
      out.push_back({.begin = r.offset, .count = r.count, .local = local});
    } else {
      for (const ParamSpec& spec : params.specs()) {
        if (std::find(roles.begin(), roles.end(), param_role(spec)) == roles.end()) continue;
        const int64_t lo = std::max(spec.offset, r.offset),
                      hi = std::min(spec.offset + spec.shape.numel(), r.offset + r.count);
        if (lo < hi) out.push_back({.begin = lo, .count = hi - lo, .local = local + lo - r.offset});
      }
    }
    local += r.count;
  }
  return out;
}

}  // namespace

int64_t AdamW::moment_elements(const ParameterStore& params, const ShardLayout& shard,
                               const std::vector<ParamRole>& roles) {
  int64_t n = 0;
  const ShardLayout layout =
      shard.pieces.empty()
          ? ShardLayout::cut(params.padded(), std::max<int64_t>(1, params.padded()))
          : shard;
  for (const ShardPiece& stretch : routed_stretches(params, layout, roles)) n += stretch.count;
  return n;
}

AdamW::AdamW(const ParameterStore& params, const AdamWConfig& config, ShardLayout shard,
             std::vector<ParamRole> roles)
    : config_(config), arena_(MemoryTag::optimizer, params.backend()) {
  if (shard.pieces.empty())
    shard = ShardLayout::cut(params.padded(), std::max<int64_t>(1, params.padded()));
  int64_t moments = 0;
  for (const ShardPiece& stretch : routed_stretches(params, shard, roles)) {
    // Under ZeRO-2 the gradients sit at the stretch's place in the shard (`local`); the
    // moments lay the routed stretches end to end.
    Part& part =
        parts_.emplace_back(Part{{stretch.begin, stretch.count}, stretch.local, moments, {}});
    owned_.push_back({.begin = stretch.begin, .count = stretch.count, .local = moments});
    moments += stretch.count;
    // Parameters declared without weight decay, as ranges of this stretch; adjacent ones
    // merge, so that the update's pass alternates between as few stretches as it can.
    const int64_t begin = stretch.begin, end = stretch.begin + stretch.count;
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
  m_ = arena_.alloc({moments});
  v_ = arena_.alloc({moments});
}

void AdamW::step(Backend& be, const ParameterStore& params, float lr, Tensor control,
                 Tensor grad_shard) {
  step_at(be, params, lr, control, grad_shard, steps_taken() + 1);
}

void AdamW::step_at(Backend& be, const ParameterStore& params, float lr, Tensor control,
                    Tensor grad_shard, int64_t step) {
  AdamWArgs args;
  args.lr = lr;
  args.beta1 = config_.beta1;
  args.beta2 = config_.beta2;
  args.eps = config_.eps;
  args.weight_decay = config_.weight_decay;
  args.step = step;
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
    be.adamw_update(values, compute, grads, m_.view(part.moments, range),
                    v_.view(part.moments, range), control, args);
  }
}

std::vector<FlatSource> AdamW::held_state() const {
  return {{"exp_avg/", m_, owned_}, {"exp_avg_sq/", v_, owned_}};
}

}  // namespace bottle
