#pragma once
// Pipeline schedules as pure functions (docs/design.md §8): (stages, stage, micro-batches) → the
// ordered actions that stage runs. The executor only follows the list. Sends and receives
// are blocking; every adjacent pair of stages posts its messages in the same order, so the
// schedule cannot deadlock (tests/parallel/test_pipeline_schedule.cpp simulates every stage with
// rendezvous semantics to check it).
//   gpipe  all forwards, then all backwards: M micro-batches of activations alive.
//   1f1b   warm-up forwards (stages - stage - 1), then one forward / one backward, then
//          the remaining backwards: at most `stages - stage` alive on a stage.
#include <string>
#include <vector>

namespace bottle {

enum class PipelineSchedule { one_f_one_b, gpipe };

enum class ActionKind {
  recv_activation,  // from the previous stage: the input of micro-batch m
  forward,
  send_activation,  // to the next stage: the output of micro-batch m
  recv_gradient,    // from the next stage: ∂loss/∂(output of m)
  backward,
  send_gradient,  // to the previous stage: ∂loss/∂(input of m)
};

struct Action {
  ActionKind kind;
  int micro_batch;
  bool operator==(const Action&) const = default;
};

std::vector<Action> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches);

// The most micro-batches whose activations are alive at once on `stage`.
int peak_in_flight(const std::vector<Action>& actions);
// The idle fraction of a pipeline step with equal forward (1) and backward (2) times per
// stage and micro-batch: (stages - 1) / (micro_batches + stages - 1) for both schedules.
double bubble_fraction(PipelineSchedule schedule, int stages, int micro_batches);

std::string to_string(const Action& action);

}  // namespace bottle
