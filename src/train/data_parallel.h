#pragma once
// Data parallelism over the DP group (docs/design.md §9): the gradients are averaged over the
// DP ranks in buckets of `bucket_bytes` (one all-reduce each: no full-model scratch buffer, and
// the count of collectives says how the traffic was cut). The buckets are cut from the end of
// the flat buffer, the order in which backward finishes them (the LM head first, the
// embedding last). With overlap, the step's last backward reports each suffix of the gradients
// it has finished (LlamaModel::GradsReady) and the buckets inside it start reducing at once,
// on the group's communication thread, while the earlier blocks' backward computes — PyTorch
// DDP's and Megatron's --overlap-grad-reduce. Each bucket is the same all-reduce either way, so
// overlap changes when the sums are made, never their bits.
//
// With ZeRO-1 each rank owns 1/dp of the flat parameter buffer: the gradients are
// reduce-scattered to their owners after backward (not overlapped), AdamW updates (and keeps
// moments for) only the owned range, and the updated parameters are all-gathered. Under mixed
// precision each rank casts its own range to bf16 and the all-gather moves bf16 compute
// weights; the fp32 masters of the other ranks' ranges are gathered only when a checkpoint
// needs them.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "model/parameters.h"

namespace bottle {

class DataParallel {
 public:
  // dp null or of size 1: a no-op. The store must have been allocated with its count
  // padded to a multiple of dp (ParameterStore::allocate(pad)). overlap: buckets start in
  // grads_ready() (ZeRO 0). held: a flat range that changes after backward
  // (LlamaModel::tied_grad_range): the buckets that touch it start in reduce_gradients().
  DataParallel(Communicator* dp, const ParameterStore& params, int zero, bool overlap = false,
               std::pair<int64_t, int64_t> held = {0, 0}, int64_t bucket_bytes = int64_t(32) << 20);

  int size() const { return dp_ ? dp_->size() : 1; }
  Communicator* group() const { return dp_; }  // null: one replica
  bool zero() const { return zero_ && size() > 1; }
  // Whether grads_ready() starts reductions.
  bool overlapping() const { return overlap_ && size() > 1 && !zero(); }
  // The flat range [begin, end) whose gradients are valid after reduce_gradients() and
  // whose parameters this rank updates: everything without ZeRO.
  int64_t begin() const { return begin_; }
  int64_t end() const { return end_; }

  // One line for the run's log: how the gradients travel ("" for one replica).
  std::string describe() const;

  // The step's last backward has finished the gradients of [begin, end of the buffer): the
  // buckets inside it that have not started start now (when overlapping; else nothing).
  void grads_ready(int64_t begin);
  // grads = mean over the DP ranks (on [begin, end) with ZeRO): starts the buckets that have
  // not started, waits for every one and scales it.
  void reduce_gradients(Backend& be);
  // After an update, which wrote the compute weights (bf16 under mixed precision) of the range
  // it updated: under ZeRO-1 those of every range on every rank (with fp32, the values
  // themselves); without ZeRO there is nothing to do.
  void gather_parameters(Backend& be);
  // ZeRO-1 under mixed precision: every rank's fp32 masters whole again (for a checkpoint).
  // No-op otherwise.
  void gather_masters();

 private:
  struct Bucket {
    int64_t begin = 0, end = 0;  // flat range of the gradients
    bool held = false;           // touches the held range: starts after backward
    PendingCall call;            // started, not yet waited for
    bool started = false;
  };
  void start(Bucket& bucket);

  Communicator* dp_;
  const ParameterStore& params_;
  int zero_;
  bool overlap_;
  std::vector<Bucket> buckets_;  // last first: the order backward finishes them
  int64_t begin_ = 0, end_ = 0;
  Arena scratch_arena_;     // comm, on the parameters' backend
  Tensor scratch_;          // [shard] ZeRO: the reduce-scatter output / all-gather input
  Tensor scratch_compute_;  // [shard] bf16 ZeRO under mixed precision: the all-gather input
};

}  // namespace bottle
