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
// With ZeRO-1 each rank owns 1/dp of every bucket (ShardLayout): each bucket is
// reduce-scattered to its owners (during backward, as the all-reduces are), AdamW updates (and
// keeps moments for) only the owned slices, and the updated parameters are all-gathered, one
// call per bucket. Under mixed precision each rank casts its own slices to bf16 and the
// all-gathers move bf16 compute weights; the fp32 masters of the other ranks' slices are
// gathered only when a checkpoint needs them.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/backend.h"
#include "model/parameters.h"
#include "train/shard_layout.h"

namespace bottle {

class DataParallel {
 public:
  struct Options {
    int zero = 0;                       // ZeRO stage
    bool overlap_grad_reduce = false;   // buckets start in grads_ready()
    bool overlap_param_gather = false;  // ZeRO: gathers waited in params_needed()
    // A flat range that changes after backward (LlamaModel::tied_grad_range): the buckets
    // that touch it start in reduce_gradients().
    std::pair<int64_t, int64_t> held{0, 0};
    int64_t bucket_bytes = int64_t(32) << 20;
  };
  // dp null or of size 1: a no-op. The store must have been allocated with its count
  // padded to a multiple of dp under ZeRO (ParameterStore::allocate(pad)).
  DataParallel(Communicator* dp, const ParameterStore& params, const Options& options);

  int size() const { return dp_ ? dp_->size() : 1; }
  Communicator* group() const { return dp_; }  // null: one replica
  bool zero() const { return options_.zero && size() > 1; }
  // Whether grads_ready() starts reductions.
  bool overlapping() const { return options_.overlap_grad_reduce && size() > 1; }
  // What this rank owns: the flat ranges whose gradients are valid after reduce_gradients()
  // and whose parameters it updates (everything without ZeRO).
  const ShardLayout& shard() const { return shard_; }

  // One line for the run's log: how the gradients travel ("" for one replica).
  std::string describe() const;

  // The step's last backward has finished the gradients of [begin, end of the buffer): the
  // buckets inside it that have not started start now (when overlapping; else nothing).
  void grads_ready(int64_t begin);
  // grads = mean over the DP ranks (on the owned slices under ZeRO): starts the buckets that
  // have not started, waits for every one and scales it.
  void reduce_gradients(Backend& be);
  // After an update, which wrote the compute weights (bf16 under mixed precision) of the
  // slices it updated: under ZeRO those of every slice on every rank (with fp32, the values
  // themselves); without ZeRO there is nothing to do. With overlap_param_gather the bucket
  // all-gathers start, first bucket first, and are waited for where the next forward first
  // reads them (params_needed) or by finish_gathers(); otherwise they are waited for here.
  void gather_parameters(Backend& be);
  // The parameters of the flat range [0, end) are about to be read: the gathers of the
  // buckets that start below `end` end first (LlamaModel::ParamsNeeded).
  void params_needed(int64_t end);
  // Every started gather ends: before anything else reads the parameters (evaluation, a
  // checkpoint) or the buffers they gather into.
  void finish_gathers() { params_needed(shard_.total); }
  // Whether gathers started by gather_parameters() are still to be waited for.
  bool gathering() const { return !gathers_.empty(); }
  // ZeRO under mixed precision: every rank's fp32 masters whole again (for a checkpoint).
  // No-op otherwise.
  void gather_masters();

 private:
  struct Bucket {
    ShardPiece piece;   // its flat range and the slice this rank owns
    bool held = false;  // touches the held range: starts after backward
    PendingCall call;   // started, not yet waited for
    bool started = false;
  };
  void start(Bucket& bucket);

  Communicator* dp_;
  const ParameterStore& params_;
  Options options_;
  ShardLayout shard_;
  // Started parameter gathers, first bucket first (overlap_param_gather).
  std::vector<ShardLayout::StartedGather> gathers_;
  std::vector<Bucket> buckets_;  // last first: the order backward finishes them
  Arena scratch_arena_;          // comm, on the parameters' backend
  Tensor scratch_;               // [shard] ZeRO: the reduce-scatters' output / all-gathers' input
  Tensor scratch_compute_;       // [shard] bf16 ZeRO under mixed precision: all-gathers' input
};

}  // namespace bottle
