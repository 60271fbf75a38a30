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

}  // namespace bottle
