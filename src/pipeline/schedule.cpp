#include "pipeline/schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace bottle {
namespace {

void add_forward(std::vector<Action>& out, int stages, int stage, int m) {
  if (stage > 0) out.push_back({ActionKind::recv_activation, m});
  out.push_back({ActionKind::forward, m});
  if (stage + 1 < stages) out.push_back({ActionKind::send_activation, m});
}

void add_backward(std::vector<Action>& out, int stages, int stage, int m) {
  if (stage + 1 < stages) out.push_back({ActionKind::recv_gradient, m});
  out.push_back({ActionKind::backward, m});
  if (stage > 0) out.push_back({ActionKind::send_gradient, m});
}

}  // namespace

std::vector<Action> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches) {
  BOTTLE_ASSERT(stages > 0 && stage >= 0 && stage < stages && micro_batches > 0,
                "pipeline schedule: stage {} of {} with {} micro-batches", stage, stages,
                micro_batches);
  std::vector<Action> out;
  if (schedule == PipelineSchedule::gpipe) {
    for (int m = 0; m < micro_batches; ++m) add_forward(out, stages, stage, m);
    for (int m = 0; m < micro_batches; ++m) add_backward(out, stages, stage, m);
    return out;
  }
  const int warmup = std::min(stages - stage - 1, micro_batches);
  int next_forward = 0, next_backward = 0;
  for (; next_forward < warmup; ++next_forward) add_forward(out, stages, stage, next_forward);
  while (next_forward < micro_batches) {
    add_forward(out, stages, stage, next_forward++);
    add_backward(out, stages, stage, next_backward++);
  }
  while (next_backward < micro_batches) add_backward(out, stages, stage, next_backward++);
  return out;
}

int peak_in_flight(const std::vector<Action>& actions) {
  int alive = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::forward) peak = std::max(peak, ++alive);
    if (a.kind == ActionKind::backward) --alive;
  }
  return peak;
}

double bubble_fraction(PipelineSchedule, int stages, int micro_batches) {
  return double(stages - 1) / double(micro_batches + stages - 1);
}

std::string to_string(const Action& a) {
  constexpr const char* names[] = {"recv_activation", "forward",  "send_activation",
                                   "recv_gradient",   "backward", "send_gradient"};
  return fmt::format("{}({})", names[int(a.kind)], a.micro_batch);
}

}  // namespace bottle
