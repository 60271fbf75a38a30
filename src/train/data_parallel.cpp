#include "train/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>

namespace bottle {

DataParallel::DataParallel(Communicator* dp, const ParameterStore& params, const Options& options)
    : dp_(dp),
      params_(params),
      options_(options),
      scratch_arena_(MemoryTag::comm, params.backend()),
      grad_arena_(MemoryTag::gradients, params.backend()) {
  const int64_t total = params.padded();
  int64_t bucket = bucket_elements(options.bucket_bytes, this->zero() ? size() : 1);
  if (this->zero()) {
    BOTTLE_ASSERT(total % size() == 0,
                  "ZeRO: the flat parameter buffer ({}) is not padded to a multiple of the {} "
                  "data-parallel ranks",
                  total, size());
    shard_ = layout(params, options.zero, size(), dp_->rank(), options.bucket_bytes);
    if (shards_gradients()) grad_shard_ = grad_arena_.alloc({shard_.count});
    scratch_ = scratch_arena_.alloc({shard_.count});
    // ZeRO-1 and 2 gather the compute copies; ZeRO-3 the masters themselves, into the slots.
    if (params.mixed_precision() && !shards_parameters())
      scratch_compute_ = scratch_arena_.alloc({shard_.count}, params.compute_values().dtype);
  } else {
    shard_ = ShardLayout::cut(total, bucket);
  }
  if (size() == 1) return;
  const std::vector<ParamUnit>& units = params.units();
  unit_buckets_.resize(units.size());
  for (const ShardPiece& piece : shard_.pieces) {
    Bucket& b = buckets_.emplace_back();
    b.piece = piece;
    b.held = piece.bucket < options.held.second &&
             options.held.first < piece.bucket + piece.bucket_count;
    while (b.unit + 1 < units.size() && units[b.unit + 1].begin <= piece.bucket) ++b.unit;
    unit_buckets_[b.unit].push_back(buckets_.size() - 1);
  }
}

ShardLayout DataParallel::layout(const ParameterStore& params, int zero, int ranks, int rank,
                                 int64_t bucket_bytes) {
  const int64_t total = params.padded(), bucket = bucket_elements(bucket_bytes, ranks);
  if (zero >= 3) {
    // The store keeps this rank's slices of the masters, cut as the buckets are here.
    BOTTLE_ASSERT(params.value_slots() && params.values_shard().total == total &&
                      params.values_shard().count * ranks == total,
                  "ZeRO-3 over a store whose values are not sharded over the {} ranks", ranks);
    ShardLayout out = params.values_shard();
    for (ShardPiece& p : out.pieces) p.begin = p.bucket + p.count * rank;
    return out;
  }
  if (zero == 2) {
    BOTTLE_ASSERT(params.grad_slots(), "ZeRO-2 over a store without gradient slots");
    // No bucket crosses a unit: each is reduced as soon as its unit's backward is done.
    std::vector<ElementRange> units;
    for (const ParamUnit& u : params.units()) units.push_back({u.begin, u.count()});
    return ShardLayout::cut(units, bucket, ranks, rank);
  }
  return ShardLayout::cut(total, bucket, ranks, rank);
}

int64_t DataParallel::bucket_elements(int64_t bucket_bytes, int ranks) {
  const int64_t bucket = std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)));
  // Every bucket splits into dp equal slices: the first one cut (the buffer's start) too, as
  // the buffer is a multiple of dp.
  return (bucket + ranks - 1) / ranks * ranks;
}

std::string DataParallel::describe() const {
  if (size() == 1) return "";
  int64_t largest = 0;
  for (const Bucket& b : buckets_) largest = std::max(largest, b.piece.bucket_count);
  const char* when = shards_gradients()
                         ? (overlapping() ? "during every backward" : "after every block")
                         : (overlapping() ? "during backward" : "after backward");
  std::string line = fmt::format(
      "data parallel: dp {}, gradients in {} bucket(s) of up to {} {} {} "
      "(parallel.overlap_grad_reduce = {})",
      size(), buckets_.size(), format_bytes(size_t(largest) * sizeof(float)),
      zero() ? "reduce-scattered" : "reduced", when, options_.overlap_grad_reduce);
  if (zero() && !shards_parameters())
    line += fmt::format(
        ", each rank updating 1/{} of each (ZeRO-{}), parameters all-gathered {} "
        "(parallel.overlap_param_gather = {})",
        size(), options_.zero,
        options_.overlap_param_gather ? "during the next forward" : "after the update",
        options_.overlap_param_gather);
  else if (shards_parameters())
    line += fmt::format(
        ", each rank updating 1/{} of each (ZeRO-3, parallel.overlap_param_gather = {})", size(),
        options_.overlap_param_gather);
  if (shards_gradients())
    line += fmt::format(", gradients kept as 1/{} shards ({} held per unit in two slots)", size(),
                        format_bytes(params_.grad_bytes()));
  if (shards_parameters())
    line += fmt::format(
        ", parameters kept as 1/{} shards and gathered per unit before its forward and its "
        "backward, {} ({} of weights held)",
        size(),
        options_.overlap_param_gather ? "the next unit's gather started while a unit computes"
                                      : "each when it is needed",
        format_bytes(params_.bytes() + params_.compute_bytes()));
  return line;
}

void DataParallel::start(Bucket& bucket) {
  const ShardPiece& p = bucket.piece;
  const ParamUnit& unit = params_.units()[bucket.unit];
  const Tensor grads =  // [bucket]
      params_.grad_slots()
          ? params_.unit_grads(bucket.unit).view(p.bucket - unit.begin, {p.bucket_count})
          : params_.grads().view(p.bucket, {p.bucket_count});
  bucket.call = zero() ? dp_->start_reduce_scatter(scratch_.view(p.local, {p.count}), grads,
                                                   "dp.grads.bucket")
                       : dp_->start_all_reduce(grads, ReduceOp::sum, "dp.grads.bucket");
  bucket.started = true;
}

void DataParallel::backward_begins(Backend& be, bool final) {
  if (!shards_gradients()) return;
  be_ = &be;
  final_ = final;
  // The last units of the previous backward may still be reducing out of their slots.
  fold_pending();
  prepare_slot(params_.units().size() - 1);
}

void DataParallel::grads_ready(int64_t begin) {
  if (shards_gradients()) {
    const std::vector<ParamUnit>& units = params_.units();
    for (size_t u = 0; u < units.size(); ++u)
      if (units[u].begin == begin) unit_done(u);
    return;
  }
  if (!overlapping()) return;
  // Every DP rank runs the same backward, so the buckets start in one order on all of them.
  for (Bucket& b : buckets_) {
    if (b.piece.bucket < begin) break;
    if (!b.started && !b.held) start(b);
  }
}

// Unit u's backward is done: its buckets reduce-scatter out of its slot (a kept unit's wait for
// the step's last backward, as ZeRO-1's do), then the next unit's slot is made ready.
void DataParallel::unit_done(size_t u) {
  const ParamUnit& unit = params_.units()[u];
  if (unit.kept) {
    if (final_ && overlapping())
      for (size_t b : unit_buckets_[u])
        if (!buckets_[b].started && !buckets_[b].held) start(buckets_[b]);
  } else {
    for (size_t b : unit_buckets_[u]) start(buckets_[b]);
    pending_[u % 2] = int64_t(u);
    if (!overlapping()) fold_pending();
  }
  if (u > 0) prepare_slot(u - 1);
}

void DataParallel::prepare_slot(size_t u) {
  if (params_.units()[u].kept) return;  // zeroed with the step (ParameterStore::zero_grads)
  if (const int64_t last = pending_[u % 2]; last >= 0) {
    fold_unit(size_t(last));
    pending_[u % 2] = -1;
  }
  be_->fill_zero(params_.unit_grads(u));
}

void DataParallel::fold_pending() {
  for (int64_t& unit : pending_)
    if (unit >= 0) {
      fold_unit(size_t(unit));
      unit = -1;
    }
}

void DataParallel::fold_unit(size_t u) {
  for (size_t b : unit_buckets_[u]) fold(buckets_[b]);
}

// A bucket's reduce-scatter lands in the scratch shard; the first of a step is copied into the
// gradient shard, the later micro-batches' are added to it, in the order they were issued.
void DataParallel::fold(Bucket& bucket) {
  bucket.call.wait();
  bucket.started = false;
  const ShardPiece& p = bucket.piece;
  const Tensor reduced = scratch_.view(p.local, {p.count});  // [slice]
  const Tensor kept = grad_shard_.view(p.local, {p.count});  // [slice]
  if (bucket.folded)
    be_->accumulate(kept, reduced);
  else
    be_->copy(kept, reduced);
  bucket.folded = true;
}

void DataParallel::reduce_gradients(Backend& be) {
  if (size() == 1) return;
  if (shards_gradients()) {
    be_ = &be;
    fold_pending();
    // The kept units (a tied table): reduced once, now that the pipeline has added the
    // table's two copies.
    for (Bucket& b : buckets_)
      if (params_.units()[b.unit].kept && !b.started) start(b);
    for (Bucket& b : buckets_)
      if (params_.units()[b.unit].kept) fold(b);
    be.scale(grad_shard_, 1.0f / float(size()));
    for (Bucket& b : buckets_) b.folded = false;
    return;
  }
  const Tensor grads = params_.grads();
  for (Bucket& b : buckets_)
    if (!b.started) start(b);
  // The owned part of each bucket, reduced: the whole bucket, or this rank's slice of it,
  // which under ZeRO arrives in the scratch shard.
  const float inv = 1.0f / float(size());
  for (Bucket& b : buckets_) {
    b.call.wait();
    b.started = false;
    const ShardPiece& p = b.piece;
    const Tensor owned = grads.view(p.begin, {p.count});  // [slice]
    if (zero()) be.copy(owned, scratch_.view(p.local, {p.count}));
    be.scale(owned, inv);
  }
}

void DataParallel::gather_parameters(Backend& be) {
  // AdamW has written the compute copy of what it updated: all of it without ZeRO.
  if (!zero()) return;
  if (shards_parameters()) {
    // Every slot's values are older than the update now; a kept unit is gathered whole again.
    for (int slot = 0; slot < 2; ++slot) {
      wait_slot(slot);
      resident_[slot] = -1;
    }
    std::vector<PendingCall> calls;
    for (size_t u = 0; u < params_.units().size(); ++u)
      if (params_.units()[u].kept) start_unit_calls(u, calls, "dp.params.all_gather");
    for (PendingCall& call : calls) call.wait();
    params_.refresh_compute(be);
    return;
  }
  BOTTLE_ASSERT(gathers_.empty(), "DataParallel: parameters gathered twice without a forward");
  // Under mixed precision the bf16 compute weights travel; in fp32, the values themselves.
  const bool mixed = params_.mixed_precision();
  const Tensor whole = mixed ? params_.compute_values() : params_.values();  // [padded]
  const Tensor shard = mixed ? scratch_compute_ : scratch_;                  // [shard]
  shard_.take(be, shard, whole);
  if (options_.overlap_param_gather)
    gathers_ = shard_.start_gather(dp_, whole, shard, "dp.params.all_gather");
  else
    shard_.gather(be, dp_, whole, shard, "dp.params.all_gather");
}

void DataParallel::params_needed(int64_t end) {
  if (shards_parameters()) {
    const size_t u = unit_ending_at(end);
    ensure_unit(u);
    if (options_.overlap_param_gather && u + 1 < params_.units().size()) start_unit_gather(u + 1);
    return;
  }
  size_t done = 0;
  while (done < gathers_.size() && gathers_[done].bucket < end) gathers_[done++].call.wait();
  gathers_.erase(gathers_.begin(), gathers_.begin() + std::ptrdiff_t(done));
}

void DataParallel::params_needed_backward(int64_t end) {
  if (!shards_parameters()) return;
  const size_t u = unit_ending_at(end);
  ensure_unit(u);
  if (options_.overlap_param_gather && u > (options_.first_unit_forward_only ? 1u : 0u))
    start_unit_gather(u - 1);
}

void DataParallel::finish_gathers() {
  if (shards_parameters()) {
    for (int slot = 0; slot < 2; ++slot) wait_slot(slot);
    return;
  }
  params_needed(shard_.total);
}

FlatSource DataParallel::held_masters() {
  if (!zero()) return {"", params_.values(), whole_buffer(params_.padded())};
  finish_gathers();
  if (shards_parameters()) return {"", params_.values(), shard_.pieces};
  return {"", params_.values(), owned_in_whole_buffer(shard_)};
}

size_t DataParallel::unit_ending_at(int64_t end) const {
  const std::vector<ParamUnit>& units = params_.units();
  for (size_t u = 0; u < units.size(); ++u)
    if (units[u].end == end) return u;
  BOTTLE_ASSERT(false, "ZeRO-3: no parameter unit ends at {}", end);
  return 0;
}

void DataParallel::wait_slot(int slot) {
  for (PendingCall& call : slot_calls_[slot]) call.wait();
  slot_calls_[slot].clear();
}

// Unit u's values from every rank's shard of the masters into its slot (or kept buffer): one
// all-gather per bucket, started, appended to `calls`.
void DataParallel::start_unit_calls(size_t u, std::vector<PendingCall>& calls,
                                    std::string_view site) {
  const ParamUnit& unit = params_.units()[u];
  const Tensor values = params_.unit_values(u);  // [unit]
  for (size_t b : unit_buckets_[u]) {
    const ShardPiece& p = buckets_[b].piece;
    calls.push_back(dp_->start_all_gather(values.view(p.bucket - unit.begin, {p.bucket_count}),
                                          params_.values().view(p.local, {p.count}), site));
  }
}

// Unit u's gather into its slot, unless the slot holds it already; the slot's earlier gathers
// end first (their unit is done with).
void DataParallel::start_unit_gather(size_t u) {
  const int slot = int(u % 2);
  if (params_.units()[u].kept || resident_[slot] == int64_t(u)) return;
  wait_slot(slot);
  start_unit_calls(u, slot_calls_[slot], "dp.params.unit_gather");
  resident_[slot] = int64_t(u);
  cast_pending_[slot] = params_.mixed_precision();
}

// Unit u's values gathered and, under mixed precision, cast to the compute copy the GEMMs read:
// the bf16 that AdamW's update writes from the same fp32 under ZeRO-0, so ZeRO-0's bits.
void DataParallel::ensure_unit(size_t u) {
  if (params_.units()[u].kept) return;
  const int slot = int(u % 2);
  start_unit_gather(u);
  wait_slot(slot);
  if (cast_pending_[slot]) {
    params_.backend().copy(params_.unit_compute(u), params_.unit_values(u));
    cast_pending_[slot] = false;
  }
}

}  // namespace bottle
