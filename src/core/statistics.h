#pragma once
// Statistics over a handful of timings, shared by the training loop, the benches and the
// calibration.
#include <algorithm>
#include <vector>

#include "core/error.h"

namespace bottle {

// The median of `values`: for an even count the upper of the two middle values (element n/2
// once sorted), as every report of bottle has taken it. `values` must not be empty.
inline double median(std::vector<double> values) {
  BOTTLE_CHECK(!values.empty(), "median of no values");
  const auto middle = values.begin() + std::ptrdiff_t(values.size() / 2);
  std::nth_element(values.begin(), middle, values.end());
  return *middle;
}

// The median of a bench's timings with their extremes, which a report prints beside it.
struct Spread {
  double median = 0, min = 0, max = 0;
};

// All zero for no values.
inline Spread spread_of(const std::vector<double>& values) {
  if (values.empty()) return {};
  const auto [min, max] = std::minmax_element(values.begin(), values.end());
  return {median(values), *min, *max};
}

}  // namespace bottle
