#pragma once
// Replays every stage's action list (schedule.h) in time, under the executor's semantics
// (executor.h): a stage runs its list in order, a compute pass takes its cost, a send never
// blocks and its message arrives `latency` seconds after it, and a receive waits until its
// message has arrived. What comes out is each stage's busy and idle time and the step's
// makespan; a list that cannot finish (a receive whose message is never sent, or stages
// waiting on each other) fails, naming where each stuck stage waits. The planner prices a
// pipeline by it, bubble_fraction and `bench pipeline` compute the theory with it, and the
// tests check every schedule with it (docs/design.md §8).
#include <vector>

#include "pipeline/schedule.h"

namespace bottle {

// Seconds of one stage's passes of one chunk, and of its messages in flight.
struct PassCosts {
  double forward = 1, backward_input = 1, backward_weight = 1, backward = 2;
  double activation_latency = 0;  // a send_activation of this stage to its arrival
  double gradient_latency = 0;    // a send_gradient of this stage to its arrival
};

struct ReplayResult {
  std::vector<double> busy;  // [stages] seconds computing
  std::vector<double> idle;  // [stages] makespan − busy: waiting, before, between and after
  double makespan = 0;       // when the last stage's last action ends
  // Whether every (sender, receiver) pair's receives come in the order of its sends, whatever
  // their kind: a communicator that matches messages in issue order (NCCL) needs it.
  bool channels_in_order = true;
  // The idle share of all stages' time: Σ idle / (stages · makespan).
  double bubble_fraction() const;
};

// costs: [stages], each stage's own. Fails on a deadlock, a receive from a stage that never
// sends it, a peer out of range, or a message nobody receives.
ReplayResult replay_schedule(const std::vector<std::vector<Action>>& lists,
                             const std::vector<PassCosts>& costs);
// The same costs on every stage.
ReplayResult replay_schedule(const std::vector<std::vector<Action>>& lists, const PassCosts& costs);

// The makespan of `schedule`'s step with these costs ([stages]), as replay_schedule gives it,
// without replaying millions of micro-batches: beyond `exact_up_to` (at least 8·stages) the
// step grows by the same period per micro-batch once the pipeline is full, so two replays of
// fewer micro-batches, one group of `stages` apart, give it (tests/parallel/
// test_pipeline_schedule.cpp checks it against whole replays).
double pipeline_makespan(PipelineSchedule schedule, int stages, int64_t micro_batches,
                         int virtual_stages, const std::vector<PassCosts>& costs,
                         int64_t exact_up_to = 256);

}  // namespace bottle
