#include "train/data_parallel.h"

#include <algorithm>

namespace bottle {

DataParallel::DataParallel(Communicator* dp, const ParameterStore& params, int zero,
                           int64_t bucket_bytes)
    : dp_(dp),
      params_(params),
      zero_(zero),
      bucket_elems_(std::max<int64_t>(1, bucket_bytes / int64_t(sizeof(float)))),
      scratch_arena_(MemoryTag::comm, params.backend()) {
  const int64_t total = params.values().numel();
  end_ = total;
  if (!this->zero()) return;
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
  for (int64_t at = 0; at < grads.numel(); at += bucket_elems_) {
    const Tensor bucket = grads.view(at, {std::min(bucket_elems_, grads.numel() - at)});
    dp_->all_reduce(bucket, ReduceOp::sum, "dp.grads.bucket");
    be.scale(bucket, inv);
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
