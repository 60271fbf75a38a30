// backend/profiling_backend.h: every op timed, and the ops inside a backend range
// (Backend::push_range, BackendRange) summed under the range's path, which is how bench tp
// --components times a layout's projection groups (TpLayout::components) without a timer of
// its own inside the layers.
#include <gtest/gtest.h>

#include "core/arena.h"
#include "backend/profiling_backend.h"

namespace bottle::testing {
namespace {

TEST(ProfilingBackend, RangesCountTheOpsInsideThemUnderTheirPath) {
  ProfilingBackend be(make_backend("cpu"));
  Arena arena(MemoryTag::activations, be);
  const Tensor x = arena.alloc({64}), y = arena.alloc({64});  // [64] each
  be.fill_zero(x);                                            // outside every range
  {
    const BackendRange qkv(be, "qkv");
    be.fill_zero(y);
    be.accumulate(x, y);
  }
  {
    const BackendRange recompute(be, "recompute");
    be.fill_zero(x);  // in "recompute" itself
    const BackendRange qkv(be, "qkv");
    be.accumulate(x, y);
  }
  { const BackendRange none(be, nullptr); }  // a null name opens no range
  be.fill_zero(y);

  const auto& ranges = be.range_times();
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges.at("qkv").calls, 2);
  EXPECT_EQ(ranges.at("recompute").calls, 1);  // each op under its innermost path alone
  EXPECT_EQ(ranges.at("recompute.qkv").calls, 1);
  for (const auto& [path, time] : ranges) EXPECT_GE(time.ms, 0.0) << path;
  // Every op is in the per-kernel profile too, inside a range or not.
  const auto& kernels = be.times();
  EXPECT_EQ(kernels.at("fill_zero").calls, 4);
  EXPECT_EQ(kernels.at("accumulate").calls, 2);

  be.reset();
  EXPECT_TRUE(be.range_times().empty());
  EXPECT_TRUE(be.times().empty());
}

TEST(ProfilingBackend, APopWithoutAPushIsAnInternalError) {
  ProfilingBackend be(make_backend("cpu"));
  EXPECT_THROW(be.pop_range(), InternalError);
}

}  // namespace
}  // namespace bottle::testing
