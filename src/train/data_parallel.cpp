#include "train/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>

namespace bottle {

DataParallel::DataParallel(Communicator* dp, const ParameterStore& params, int zero, bool overlap,
                           std::pair<int64_t, int64_t> held, int64_t bucket_bytes)
    : dp_(dp),
      params_(params),
      zero_(zero),
      overlap_(overlap),
      scratch_arena_(MemoryTag::comm, params.backend()) {
  const int64_t total = params.values().numel();
  end_ = total;
  if (!this->zero()) {
    const int64_t bucket = std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)));
    for (int64_t bucket_end = total; bucket_end > 0; bucket_end -= bucket) {
      Bucket& b = buckets_.emplace_back();
      b.begin = std::max<int64_t>(0, bucket_end - bucket);
      b.end = bucket_end;
      b.held = b.begin < held.second && held.first < b.end;
    }
    return;
  }
  BOTTLE_ASSERT(total % size() == 0,
                "ZeRO-1: the flat parameter buffer ({}) is not padded to a "
                "multiple of the {} data-parallel ranks",
                total, size());
  const int64_t shard = total / size();
  begin_ = shard * dp_->rank();
  end_ = begin_ + shard;
  scratch_ = scratch_arena_.alloc({shard});
  if (params.mixed_precision())
    scratch_compute_ = scratch_arena_.alloc({shard}, params.compute_values().dtype);
}

std::string DataParallel::describe() const {
  if (size() == 1) return "";
  if (zero())
    return fmt::format("data parallel: dp {}, gradients reduce-scattered after backward (ZeRO-1)",
                       size());
  const int64_t largest = buckets_.empty() ? 0 : buckets_.front().end - buckets_.front().begin;
  return fmt::format(
      "data parallel: dp {}, gradients in {} bucket(s) of up to {} reduced {} "
      "(parallel.overlap_grad_reduce = {})",
      size(), buckets_.size(), format_bytes(size_t(largest) * sizeof(float)),
      overlapping() ? "during backward" : "after backward", overlap_);
}

void DataParallel::start(Bucket& bucket) {
  const Tensor grads = params_.grads().view(bucket.begin, {bucket.end - bucket.begin});  // [bucket]
  bucket.call = dp_->start_all_reduce(grads, ReduceOp::sum, "dp.grads.bucket");
  bucket.started = true;
}

void DataParallel::grads_ready(int64_t begin) {
  if (!overlapping()) return;
  // Every DP rank runs the same backward, so the buckets start in one order on all of them.
  for (Bucket& b : buckets_) {
    if (b.begin < begin) break;
    if (!b.started && !b.held) start(b);
  }
}

void DataParallel::reduce_gradients(Backend& be) {
  if (size() == 1) return;
  const Tensor grads = params_.grads();
  const float inv = 1.0f / float(size());
  if (zero()) {
    dp_->reduce_scatter(scratch_, grads, "dp.grads.reduce_scatter");
    const Tensor owned = grads.view(begin_, scratch_.shape);  // [shard] this rank's range
    be.copy(owned, scratch_);
    be.scale(owned, inv);
    return;
  }
  for (Bucket& b : buckets_) {
    const Tensor bucket = grads.view(b.begin, {b.end - b.begin});  // [bucket]
    if (overlapping()) {
      if (!b.started) start(b);
    } else {
      dp_->all_reduce(bucket, ReduceOp::sum, "dp.grads.bucket");
    }
  }
  for (Bucket& b : buckets_) {
    b.call.wait();
    b.started = false;
    be.scale(grads.view(b.begin, {b.end - b.begin}), inv);
  }
}

void DataParallel::gather_parameters(Backend& be) {
  // AdamW has written the compute copy of the range it updated: all of it without ZeRO.
  if (!zero()) return;
  if (!params_.mixed_precision()) return gather_masters();
  const Tensor compute = params_.compute_values();
  be.copy(scratch_compute_, compute.view(begin_, scratch_compute_.shape));
  dp_->all_gather(compute, scratch_compute_, "dp.params.all_gather");
}

void DataParallel::gather_masters() {
  if (!zero()) return;
  const Tensor values = params_.values();
  params_.backend().copy(scratch_, values.view(begin_, scratch_.shape));
  dp_->all_gather(values, scratch_, "dp.params.all_gather");
  // A checkpoint reads them on the host next: a device group's call ends here, with its
  // errors and timeout, rather than in a stream synchronisation that cannot time out.
  dp_->complete();
}

}  // namespace bottle
