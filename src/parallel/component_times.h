#pragma once
// Wall time of the compute of named parts of a block, for the grouping ablation of BOOST
// §4.3 (`bench tp --components`): "qkv" is the q, k, v group's A GEMMs, latent stage and B
// GEMMs, forward and backward; "gate_up" the same for gate and up. Collectives are left
// out: the communicator already times them per call site (CommStats), so that compute and
// communication of a component come apart.
#include <chrono>
#include <map>
#include <string>
#include <string_view>

#include "parallel/tensor_parallel.h"

namespace bottle {

class ComponentTimes {
 public:
  void add(std::string_view component, double seconds);
  // 0 when the component was never timed.
  double seconds(std::string_view component) const;
  const std::map<std::string, double, std::less<>>& by_component() const { return seconds_; }
  void reset() { seconds_.clear(); }

 private:
  std::map<std::string, double, std::less<>> seconds_;
};

// Adds the wall time of its scope to tp.times under `component`, prefixed by the TP
// group's phase, so that recomputation counts apart ("recompute.qkv") as its collectives
// do. Does nothing (not even read the clock) when tp.times or `component` is null.
class ComponentTimer {
 public:
  ComponentTimer(const TensorParallel& tp, const char* component);
  ~ComponentTimer();
  ComponentTimer(const ComponentTimer&) = delete;
  ComponentTimer& operator=(const ComponentTimer&) = delete;

 private:
  const TensorParallel& tp_;
  const char* component_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace bottle
