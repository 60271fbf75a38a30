#include "parallel/component_times.h"

namespace bottle {

void ComponentTimes::add(std::string_view component, double seconds) {
  auto it = seconds_.find(component);
  if (it == seconds_.end()) it = seconds_.emplace(std::string(component), 0.0).first;
  it->second += seconds;
}

double ComponentTimes::seconds(std::string_view component) const {
  const auto it = seconds_.find(component);
  return it == seconds_.end() ? 0.0 : it->second;
}

ComponentTimer::ComponentTimer(const TensorParallel& tp, const char* component)
    : tp_(tp), component_(tp.times ? component : nullptr) {
  if (component_) start_ = std::chrono::steady_clock::now();
}

ComponentTimer::~ComponentTimer() {
  if (!component_) return;
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (tp_.comm && !tp_.comm->stats().phase().empty())
    tp_.times->add(tp_.comm->stats().phase() + component_, seconds);
  else
    tp_.times->add(component_, seconds);
}

}  // namespace bottle
