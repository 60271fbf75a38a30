// core/statistics.h: the one median of the timing reports, and the spread the benches print
// beside it. An even count takes the upper of the two middle values (element n/2 once sorted),
// as the benches, the calibration and the training loop's tokens/s always have.
#include <gtest/gtest.h>

#include <stdexcept>

#include "core/statistics.h"

namespace bottle::testing {
namespace {

TEST(Statistics, MedianOfAnOddCountIsTheMiddleValue) {
  EXPECT_EQ(median({3.0}), 3.0);
  EXPECT_EQ(median({5.0, 1.0, 3.0}), 3.0);
  EXPECT_EQ(median({9.0, 2.0, 7.0, 4.0, 1.0}), 4.0);
}

TEST(Statistics, MedianOfAnEvenCountIsTheUpperMiddleValue) {
  EXPECT_EQ(median({1.0, 2.0}), 2.0);
  EXPECT_EQ(median({4.0, 1.0, 3.0, 2.0}), 3.0);
  EXPECT_EQ(median({2.0, 2.0, 1.0, 1.0}), 2.0);
}

TEST(Statistics, MedianLeavesTheCallersValuesAlone) {
  const std::vector<double> values{3.0, 1.0, 2.0};
  EXPECT_EQ(median(values), 2.0);
  EXPECT_EQ(values, (std::vector<double>{3.0, 1.0, 2.0}));
}

TEST(Statistics, MedianOfNoValuesIsRefused) { EXPECT_ANY_THROW(median({})); }

TEST(Statistics, SpreadIsTheMedianAndTheExtremes) {
  const Spread s = spread_of({4.0, 1.0, 9.0, 2.0});
  EXPECT_EQ(s.median, 4.0);
  EXPECT_EQ(s.min, 1.0);
  EXPECT_EQ(s.max, 9.0);
  const Spread none = spread_of({});
  EXPECT_EQ(none.median, 0.0);
  EXPECT_EQ(none.min, 0.0);
  EXPECT_EQ(none.max, 0.0);
}

}  // namespace
}  // namespace bottle::testing
