#include "model/shard_layout.h"

#include <algorithm>

#include "core/error.h"

namespace bottle {

ShardLayout ShardLayout::cut(int64_t total, int64_t bucket, int ranks, int rank) {
  return cut(std::vector<ElementRange>{{0, total}}, bucket, ranks, rank);
}

ShardLayout ShardLayout::cut(const std::vector<ElementRange>& ranges, int64_t bucket, int ranks,
                             int rank) {
  ShardLayout layout;
  for (const ElementRange& r : ranges) layout.total += r.count;
  BOTTLE_ASSERT(bucket > 0 && ranks > 0 && layout.total % ranks == 0 && bucket % ranks == 0,
                "ShardLayout: a buffer of {} in buckets of {} does not split over {} ranks",
                layout.total, bucket, ranks);
  for (auto r = ranges.rbegin(); r != ranges.rend(); ++r) {
    BOTTLE_ASSERT(r->count % ranks == 0, "ShardLayout: a range of {} does not split over {} ranks",
                  r->count, ranks);
    for (int64_t end = r->offset + r->count; end > r->offset; end -= bucket) {
      ShardPiece& p = layout.pieces.emplace_back();
      p.bucket = std::max<int64_t>(r->offset, end - bucket);
      p.bucket_count = end - p.bucket;
      p.count = p.bucket_count / ranks;
      p.begin = p.bucket + p.count * rank;
      layout.count += p.count;
    }
  }
  // The slices lie in flat order in the shard: the last bucket's slice last.
  int64_t local = layout.count;
  for (ShardPiece& p : layout.pieces) {
    local -= p.count;
    p.local = local;
  }
  return layout;
}

std::vector<ElementRange> ShardLayout::ranges() const {
  std::vector<ElementRange> out;
  for (auto p = pieces.rbegin(); p != pieces.rend(); ++p) {
    if (!out.empty() && out.back().offset + out.back().count == p->begin)
      out.back().count += p->count;
    else
      out.push_back({p->begin, p->count});
  }
  return out;
}

void ShardLayout::take(Backend& be, Tensor shard, Tensor whole) const {
  for (const ShardPiece& p : pieces)
    be.copy(shard.view(p.local, {p.count}), whole.view(p.begin, {p.count}));
}

std::vector<ShardLayout::StartedGather> ShardLayout::start_gather(Communicator* group, Tensor whole,
                                                                  Tensor shard,
                                                                  std::string_view site) const {
  BOTTLE_ASSERT(group && group->size() * count == total,
                "ShardLayout: a shard of {} elements does not tile {} over the group", count,
                total);
  std::vector<StartedGather> calls;
  for (auto p = pieces.rbegin(); p != pieces.rend(); ++p)
    calls.push_back({p->bucket, group->start_all_gather(whole.view(p->bucket, {p->bucket_count}),
                                                        shard.view(p->local, {p->count}), site)});
  return calls;
}

void ShardLayout::gather(Backend& be, Communicator* group, Tensor whole, Tensor shard,
                         std::string_view site) const {
  if (owns_all()) {
    be.copy(whole, shard);
    return;
  }
  for (StartedGather& g : start_gather(group, whole, shard, site)) g.call.wait();
}

}  // namespace bottle
