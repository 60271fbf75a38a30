#pragma once
// Data parallelism over the DP group (docs/design.md §9): after the micro-batches' backward, the
// gradients are averaged over the DP ranks in buckets of `bucket_bytes` (one all-reduce
// each: no full-model scratch buffer, and the count of collectives says how the traffic
// was cut). With ZeRO-1 each rank owns 1/dp of the flat parameter buffer: the gradients
// are reduce-scattered to their owners, AdamW updates (and keeps moments for) only the
// owned range, and the updated parameters are all-gathered. Under mixed precision each rank
// casts its own range to bf16 and the all-gather moves bf16 compute weights; the fp32 masters
// of the other ranks' ranges are gathered only when a checkpoint needs them.
#include <cstdint>

#include "comm/communicator.h"
#include "core/backend.h"
#include "model/parameters.h"

namespace bottle {

class DataParallel {
 public:
  // dp null or of size 1: a no-op. The store must have been allocated with its count
  // padded to a multiple of dp (ParameterStore::allocate(pad)).
  DataParallel(Communicator* dp, const ParameterStore& params, int zero,
               int64_t bucket_bytes = int64_t(32) << 20);

  int size() const { return dp_ ? dp_->size() : 1; }
  Communicator* group() const { return dp_; }  // null: one replica
  bool zero() const { return zero_ && size() > 1; }
  // The flat range [begin, end) whose gradients are valid after reduce_gradients() and
  // whose parameters this rank updates: everything without ZeRO.
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

  // grads = mean over the DP ranks (on [begin, end) with ZeRO).
  void reduce_gradients(Backend& be);
  // After an update, which wrote the compute weights (bf16 under mixed precision) of the range
  // it updated: under ZeRO-1 those of every range on every rank (with fp32, the values
  // themselves); without ZeRO there is nothing to do.
  void gather_parameters(Backend& be);
  // ZeRO-1 under mixed precision: every rank's fp32 masters whole again (for a checkpoint).
  // No-op otherwise.
  void gather_masters();

 private:
  Communicator* dp_;
  const ParameterStore& params_;
  int zero_;
  int64_t bucket_elems_;
  int64_t begin_ = 0, end_ = 0;
  Arena scratch_arena_;     // comm, on the parameters' backend
  Tensor scratch_;          // [shard] ZeRO: the reduce-scatter output / all-gather input
  Tensor scratch_compute_;  // [shard] bf16 ZeRO under mixed precision: the all-gather input
};

}  // namespace bottle
