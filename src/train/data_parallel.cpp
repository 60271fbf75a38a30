#include "train/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>

namespace bottle {

DataParallel::DataParallel(Communicator* dp, const ParameterStore& params, const Options& options)
    : dp_(dp),
      params_(params),
      options_(options),
      scratch_arena_(MemoryTag::comm, params.backend()) {
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
    shard_ = ShardLayout::cut(total, bucket, size(), dp_->rank());
    scratch_ = scratch_arena_.alloc({shard_.count});
    if (params.mixed_precision())
      scratch_compute_ = scratch_arena_.alloc({shard_.count}, params.compute_values().dtype);
  } else {
    shard_ = ShardLayout::cut(total, bucket);
  }
  if (size() == 1) return;
  for (const ShardPiece& piece : shard_.pieces) {
    Bucket& b = buckets_.emplace_back();
    b.piece = piece;
    b.held = piece.bucket < options.held.second &&
             options.held.first < piece.bucket + piece.bucket_count;
  }
}

std::string DataParallel::describe() const {
  if (size() == 1) return "";
  const int64_t largest = buckets_.empty() ? 0 : buckets_.front().piece.bucket_count;
  std::string line = fmt::format(
      "data parallel: dp {}, gradients in {} bucket(s) of up to {} {} {} "
      "(parallel.overlap_grad_reduce = {})",
      size(), buckets_.size(), format_bytes(size_t(largest) * sizeof(float)),
      zero() ? "reduce-scattered" : "reduced", overlapping() ? "during backward" : "after backward",
      options_.overlap_grad_reduce);
  if (zero())
    line += fmt::format(
        ", each rank updating 1/{} of each (ZeRO-{}), parameters all-gathered {} "
        "(parallel.overlap_param_gather = {})",
        size(), options_.zero,
        options_.overlap_param_gather ? "during the next forward" : "after the update",
        options_.overlap_param_gather);
  return line;
}

void DataParallel::start(Bucket& bucket) {
  const ShardPiece& p = bucket.piece;
  const Tensor grads = params_.grads().view(p.bucket, {p.bucket_count});  // [bucket]
  bucket.call = zero() ? dp_->start_reduce_scatter(scratch_.view(p.local, {p.count}), grads,
                                                   "dp.grads.bucket")
                       : dp_->start_all_reduce(grads, ReduceOp::sum, "dp.grads.bucket");
  bucket.started = true;
}

void DataParallel::grads_ready(int64_t begin) {
  if (!overlapping()) return;
  // Every DP rank runs the same backward, so the buckets start in one order on all of them.
  for (Bucket& b : buckets_) {
    if (b.piece.bucket < begin) break;
    if (!b.started && !b.held) start(b);
  }
}

void DataParallel::reduce_gradients(Backend& be) {
  if (size() == 1) return;
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
