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
//
// With ZeRO-2 the gradients are sharded too (DeepSpeed's stage 2): the store holds them per
// unit (embedding, block, head) in two slots, unit u in slot u % 2 (ParameterStore), the
// buckets are cut inside units, and after every micro-batch's backward of a unit its buckets
// are reduce-scattered into this rank's gradient shard (added to it from the second
// micro-batch of a step on), the slot zeroed for the unit after next once they land. A tied
// table's unit keeps its gradients whole for the step (ParamUnit::kept) and is reduced as
// under ZeRO-1. With one micro-batch per step the sums are ZeRO-1's, bit for bit; with more,
// each micro-batch is summed over the ranks first (Σ_micro Σ_ranks, where ZeRO-0 and 1 add
// Σ_ranks Σ_micro), which rounds differently.
//
// With ZeRO-3 the parameters are sharded too (FSDP, DeepSpeed's stage 3): each rank keeps the
// fp32 masters of its slices alone (the store's values(), cut as the buckets are), and a unit's
// values are all-gathered into the store's slot of its parity before the unit's forward and
// again before its backward (params_needed, params_needed_backward), the next unit's gather
// started while the unit computes (parallel.overlap_param_gather), the slot reused two units
// later. Under mixed precision the fp32 masters travel and each rank casts the gathered unit
// to bf16 itself, so the GEMMs read the bits ZeRO-0 would give them. A kept unit (a tied
// table) stays whole for the step, gathered after each update. Gradients go as under ZeRO-2.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "backend/backend.h"
#include "comm/communicator.h"
#include "model/parameters.h"
#include "model/shard_layout.h"
#include "model/sharded_checkpoint.h"

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
    // ZeRO-3: backward never reads the first unit's parameters (the embedding's: its backward
    // only writes gradients), so backward does not gather it ahead.
    bool first_unit_forward_only = false;
  };
  // The bucket size in elements that a ZeRO group of `ranks` cuts (ParamSharding::bucket).
  static int64_t bucket_elements(int64_t bucket_bytes, int ranks);
  // What rank `rank` of `ranks` owns of `params` under ZeRO stage `zero` (> 0, ranks > 1): the
  // cut the constructor makes, for a plan that has no group.
  static ShardLayout layout(const ParameterStore& params, int zero, int ranks, int rank,
                            int64_t bucket_bytes);
  // dp null or of size 1: a no-op. The store must have been allocated with its count
  // padded to a multiple of dp under ZeRO (ParameterStore::allocate(pad)).
  DataParallel(Communicator* dp, const ParameterStore& params, const Options& options);

  int size() const { return dp_ ? dp_->size() : 1; }
  Communicator* group() const { return dp_; }  // null: one replica
  bool zero() const { return options_.zero && size() > 1; }
  // ZeRO-2: gradients reduced after every micro-batch's backward and kept as the shard alone.
  bool shards_gradients() const { return options_.zero >= 2 && size() > 1; }
  // ZeRO-3: parameters kept as a shard and gathered per unit.
  bool shards_parameters() const { return options_.zero >= 3 && size() > 1; }
  // ZeRO-2: [shard] the owned gradients end to end in flat order (the mean over the DP ranks
  // after reduce_gradients()); empty otherwise.
  Tensor grad_shard() const { return grad_shard_; }
  // Whether grads_ready() starts reductions.
  bool overlapping() const { return options_.overlap_grad_reduce && size() > 1; }
  // What this rank owns: the flat ranges whose gradients are valid after reduce_gradients()
  // and whose parameters it updates (everything without ZeRO).
  const ShardLayout& shard() const { return shard_; }

  // One line for the run's log: how the gradients travel ("" for one replica).
  std::string describe() const;

  // A backward of the stage begins; `final`: the step's last. Under ZeRO-2 the reductions of
  // the previous backward end (added to the shard) and the first unit's slot is zeroed on
  // `be`, which runs the step's backward.
  void backward_begins(Backend& be, bool final);
  // The step's last backward (under ZeRO-2 every backward) has finished the gradients of
  // [begin, end of the buffer): the buckets inside it that have not started start now (when
  // overlapping; else nothing, but under ZeRO-2 they are reduced at once).
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
  // A forward is about to read the parameters of the flat range [0, end): the gathers of the
  // buckets that start below `end` end first (LlamaModel::ParamsNeeded). ZeRO-3: those of the
  // unit that ends at `end`, the next unit's started.
  void params_needed(int64_t end);
  // ZeRO-3: a backward is about to read the unit that ends at `end`; the one before it is
  // started. Nothing otherwise: the forward gathered everything.
  void params_needed_backward(int64_t end);
  // Every started gather ends: before anything else reads the parameters (evaluation, a
  // checkpoint) or the buffers they gather into.
  void finish_gathers();
  // Whether gathers started by gather_parameters() are still to be waited for.
  bool gathering() const { return !gathers_.empty(); }
  // What this rank holds of the stage's fp32 masters, for a sharded checkpoint, gathering
  // nothing: the store's values whole without ZeRO; under ZeRO the owned slices alone (of the
  // store's whole buffer under ZeRO-1 and 2, where the update wrote them; the shard itself
  // under ZeRO-3). Started gathers end first: they write the values under fp32 ZeRO.
  FlatSource held_masters();

 private:
  struct Bucket {
    ShardPiece piece;   // its flat range and the slice this rank owns
    bool held = false;  // touches the held range: starts after backward
    size_t unit = 0;    // the parameter unit it lies in (ZeRO-2)
    PendingCall call;   // started, not yet waited for
    bool started = false;
    bool folded = false;  // ZeRO-2: added to the gradient shard this step
  };
  void start(Bucket& bucket);
  // ZeRO-2.
  void unit_done(size_t u);
  void prepare_slot(size_t u);  // unit u's slot free (its last unit folded) and zeroed
  void fold_unit(size_t u);
  void fold(Bucket& bucket);
  void fold_pending();
  // ZeRO-3.
  size_t unit_ending_at(int64_t end) const;
  void start_unit_calls(size_t u, std::vector<PendingCall>& calls, std::string_view site);
  void start_unit_gather(size_t u);  // into its slot, unless it holds u already
  void ensure_unit(size_t u);        // its gather waited for and cast
  void wait_slot(int slot);

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
  // ZeRO-2.
  Arena grad_arena_;                               // gradients, on the parameters' backend
  Tensor grad_shard_;                              // [shard] the owned gradients, reduced
  std::vector<std::vector<size_t>> unit_buckets_;  // per unit, its buckets (indices)
  int64_t pending_[2] = {-1, -1};  // per slot, the unit whose reduce-scatter is running
  Backend* be_ = nullptr;          // backward_begins()'s
  bool final_ = false;             // the backward under way is the step's last
  // ZeRO-3: per value slot, the unit it holds or is being gathered into it (-1: none, or
  // values older than the last update), its started calls, and whether its cast to the
  // compute dtype is still to be made.
  int64_t resident_[2] = {-1, -1};
  std::vector<PendingCall> slot_calls_[2];
  bool cast_pending_[2] = {false, false};
};

}  // namespace bottle
