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
  const int64_t total = params.values().numel();
  int64_t bucket = std::max<int64_t>(1, options.bucket_bytes / int64_t(sizeof(float)));
  if (this->zero()) {
    BOTTLE_ASSERT(total % size() == 0,
                  "ZeRO: the flat parameter buffer ({}) is not padded to a multiple of the {} "
                  "data-parallel ranks",
                  total, size());
    // Every bucket splits into dp equal slices: the first one cut (the buffer's start) too,
    // as the buffer is a multiple of dp.
    bucket = (bucket + size() - 1) / size() * size();
    if (shards_gradients()) {
      BOTTLE_ASSERT(params.grad_slots(), "ZeRO-2 over a store without gradient slots");
      // No bucket crosses a unit: each is reduced as soon as its unit's backward is done.
      std::vector<ElementRange> units;
      for (const ParamUnit& u : params.units()) units.push_back({u.begin, u.count()});
      shard_ = ShardLayout::cut(units, bucket, size(), dp_->rank());
      grad_shard_ = grad_arena_.alloc({shard_.count});
    } else {
      shard_ = ShardLayout::cut(total, bucket, size(), dp_->rank());
    }
    scratch_ = scratch_arena_.alloc({shard_.count});
    if (params.mixed_precision())
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
  if (zero())
    line += fmt::format(
        ", each rank updating 1/{} of each (ZeRO-{}), parameters all-gathered {} "
        "(parallel.overlap_param_gather = {})",
        size(), options_.zero,
        options_.overlap_param_gather ? "during the next forward" : "after the update",
        options_.overlap_param_gather);
  if (shards_gradients())
    line += fmt::format(", gradients kept as 1/{} shards ({} held per unit in two slots)", size(),
                        format_bytes(params_.grad_bytes()));
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
  size_t done = 0;
  while (done < gathers_.size() && gathers_[done].bucket < end) gathers_[done++].call.wait();
  gathers_.erase(gathers_.begin(), gathers_.begin() + std::ptrdiff_t(done));
}

void DataParallel::gather_masters() {
  if (!zero()) return;
  finish_gathers();
  Backend& be = params_.backend();
  const Tensor values = params_.values();
  shard_.take(be, scratch_, values);
  shard_.gather(be, dp_, values, scratch_, "dp.params.all_gather");
  // A checkpoint reads them on the host next: a device group's call ends here, with its
  // errors and timeout, rather than in a stream synchronisation that cannot time out.
  dp_->complete();
}

}  // namespace bottle
