#pragma once
// What one data-parallel rank owns of the flat parameter buffer (docs/design.md §9). The
// gradient buckets are cut from the end of the buffer, the order in which backward finishes
// them. Under ZeRO each bucket is a multiple of dp long and the rank owns the rank-th of its
// dp equal slices, as Megatron's distributed optimizer does, so that a bucket reduce-scattered
// during backward lands on its owners at once; without ZeRO the rank owns every bucket whole.
// The rank's shard (its AdamW moments, the reduce-scatter's output) lays the owned slices end
// to end in flat order.
#include <cstdint>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "backend/backend.h"

namespace bottle {

struct ShardPiece {
  int64_t bucket = 0, bucket_count = 0;  // the bucket's flat range [bucket, bucket + count)
  int64_t begin = 0, count = 0;          // the slice of it this rank owns, flat
  int64_t local = 0;                     // where that slice starts in the rank's shard
};

struct ShardLayout {
  std::vector<ShardPiece> pieces;  // one per bucket, the last bucket first
  int64_t total = 0;               // elements of the flat buffer
  int64_t count = 0;               // elements of the shard: the pieces' counts summed

  // Buckets of `bucket` elements (the first may be shorter) cut from the end of a buffer of
  // `total`; of each, rank `rank` of `ranks` owns one equal slice. With ranks > 1, `total` and
  // `bucket` must be multiples of `ranks`.
  static ShardLayout cut(int64_t total, int64_t bucket, int ranks = 1, int rank = 0);
  // The same over `ranges` that tile the buffer in flat order (the parameter units): buckets
  // cut from the end of each, none crossing two. Each range must be a multiple of `ranks`.
  static ShardLayout cut(const std::vector<ElementRange>& ranges, int64_t bucket, int ranks,
                         int rank);

  bool owns_all() const { return count == total; }
  // The owned flat ranges in flat order, adjacent ones merged (one range when owns_all()).
  std::vector<ElementRange> ranges() const;
  // shard [count] ← this rank's slices of whole [total].
  void take(Backend& be, Tensor shard, Tensor whole) const;
  // A bucket's all-gather, started: `bucket` is where the bucket starts in the flat buffer.
  struct StartedGather {
    int64_t bucket = 0;
    PendingCall call;
  };
  // whole [total] ← every rank's shard [count] over `group` (every rank calls): one all-gather
  // per bucket, started first bucket first (the order a forward reads them in) and returned
  // unwaited. The shard and the buckets of whole must stay untouched until each is waited for.
  std::vector<StartedGather> start_gather(Communicator* group, Tensor whole, Tensor shard,
                                          std::string_view site) const;
  // The same, waited for: the calls follow one another on the link. A copy when owns_all().
  void gather(Backend& be, Communicator* group, Tensor whole, Tensor shard,
              std::string_view site) const;
};

}  // namespace bottle
