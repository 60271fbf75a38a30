// ShardLayout (issue 44): what a data-parallel rank owns of the flat buffer under ZeRO, one
// slice of each bucket, and how its shard lays the slices out.
#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "backend/backend.h"
#include "model/shard_layout.h"

namespace bottle {
namespace {

// A buffer of 10 in buckets of 4 over 2 ranks: buckets [6, 10), [2, 6) and [0, 2), cut from
// the end; rank 1 owns the upper half of each.
TEST(ShardLayout, CutsBucketsFromTheEndAndSlicesEach) {
  const ShardLayout one = ShardLayout::cut(10, 4, 2, 1);
  ASSERT_EQ(one.pieces.size(), 3u);
  EXPECT_EQ(one.total, 10);
  EXPECT_EQ(one.count, 5);
  const int64_t want[3][5] = {{6, 4, 8, 2, 3}, {2, 4, 4, 2, 1}, {0, 2, 1, 1, 0}};
  for (size_t i = 0; i < 3; ++i) {
    const ShardPiece& p = one.pieces[i];
    EXPECT_EQ((std::vector<int64_t>{p.bucket, p.bucket_count, p.begin, p.count, p.local}),
              std::vector<int64_t>(want[i], want[i] + 5))
        << "piece " << i;
  }
  EXPECT_EQ(one.ranges(), (std::vector<ElementRange>{{1, 1}, {4, 2}, {8, 2}}));  // in flat order
  EXPECT_FALSE(one.owns_all());
}

// One rank owns every bucket whole: one range, the shard is the buffer itself.
TEST(ShardLayout, OneRankOwnsOneRange) {
  const ShardLayout all = ShardLayout::cut(10, 3);
  EXPECT_EQ(all.pieces.size(), 4u);
  EXPECT_TRUE(all.owns_all());
  EXPECT_EQ(all.ranges(), (std::vector<ElementRange>{{0, 10}}));
  for (const ShardPiece& p : all.pieces) EXPECT_EQ(p.local, p.begin);
}

// Over many shapes: the ranks' slices cover the buffer once, each slice inside its bucket, and
// each rank's shard holds its slices end to end in flat order.
TEST(ShardLayout, TheRanksSlicesTileTheBuffer) {
  for (int ranks : {1, 2, 3, 4, 8})
    for (int64_t total : {int64_t(ranks), int64_t(ranks) * 7, int64_t(ranks) * 64})
      for (int64_t bucket : {int64_t(ranks), int64_t(ranks) * 3, int64_t(ranks) * 1000}) {
        SCOPED_TRACE(testing::Message() << ranks << " ranks, " << total << " in " << bucket);
        std::vector<int> owners(size_t(total), 0);
        for (int rank = 0; rank < ranks; ++rank) {
          const ShardLayout layout = ShardLayout::cut(total, bucket, ranks, rank);
          EXPECT_EQ(layout.count * ranks, total);
          int64_t next = 0;  // the shard's slices in flat order
          for (auto p = layout.pieces.rbegin(); p != layout.pieces.rend(); ++p) {
            EXPECT_EQ(p->local, next);
            next += p->count;
            EXPECT_GE(p->begin, p->bucket);
            EXPECT_LE(p->begin + p->count, p->bucket + p->bucket_count);
            for (int64_t i = p->begin; i < p->begin + p->count; ++i) ++owners[size_t(i)];
          }
          EXPECT_EQ(next, layout.count);
        }
        for (int64_t i = 0; i < total; ++i) ASSERT_EQ(owners[size_t(i)], 1) << "element " << i;
      }
}

// Over ranges (ZeRO-2's parameter units): buckets cut from the end of each range, none
// crossing two, the ranks' slices tiling every range once, the shard in flat order.
TEST(ShardLayout, BucketsStayInsideTheirRanges) {
  const std::vector<ElementRange> units{{0, 8}, {8, 4}, {12, 12}};
  std::vector<int> owners(24, 0);
  for (int rank = 0; rank < 2; ++rank) {
    const ShardLayout layout = ShardLayout::cut(units, 6, 2, rank);
    EXPECT_EQ(layout.total, 24);
    EXPECT_EQ(layout.count, 12);
    // [18, 24), [12, 18), [8, 12), [2, 8), [0, 2): the last unit's first.
    std::vector<std::pair<int64_t, int64_t>> buckets;
    for (const ShardPiece& p : layout.pieces) buckets.emplace_back(p.bucket, p.bucket_count);
    EXPECT_EQ(buckets,
              (std::vector<std::pair<int64_t, int64_t>>{{18, 6}, {12, 6}, {8, 4}, {2, 6}, {0, 2}}));
    int64_t next = 0;
    for (auto p = layout.pieces.rbegin(); p != layout.pieces.rend(); ++p) {
      EXPECT_EQ(p->local, next);
      next += p->count;
      for (int64_t i = p->begin; i < p->begin + p->count; ++i) ++owners[size_t(i)];
    }
  }
  for (int i = 0; i < 24; ++i) EXPECT_EQ(owners[size_t(i)], 1) << "element " << i;
  // A range that does not split over the ranks is refused.
  EXPECT_THROW(ShardLayout::cut(std::vector<ElementRange>{{0, 3}, {3, 5}}, 2, 2, 0),
               std::exception);
}

// take() copies the rank's slices of a whole buffer into its shard, in flat order.
TEST(ShardLayout, TakeCopiesTheSlices) {
  Backend& be = host_backend();
  const ShardLayout layout = ShardLayout::cut(12, 6, 3, 2);
  std::vector<float> whole(12), shard(4, -1.0f);
  std::iota(whole.begin(), whole.end(), 0.0f);
  layout.take(be, Tensor{shard.data(), {4}}, Tensor{whole.data(), {12}});
  EXPECT_EQ(shard, (std::vector<float>{4, 5, 10, 11}));
}

// A bucket or a buffer that does not split over the ranks is a programming error, said.
TEST(ShardLayout, RefusesWhatDoesNotSplit) {
  EXPECT_THROW(ShardLayout::cut(10, 4, 3, 0), std::exception);
  EXPECT_THROW(ShardLayout::cut(12, 5, 3, 0), std::exception);
}

}  // namespace
}  // namespace bottle
