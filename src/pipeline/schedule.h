#pragma once
// Pipeline schedules as data (docs/design.md §8): a registry of schedules, each a pure function
// (stages, stage, micro-batches, virtual stages) → the ordered actions that stage runs. The
// executor (executor.h) only follows the list; the planner and `bench pipeline` replay the same
// lists with costs (schedule_replay.h). Sends never block and every receive names its sender,
// so a list is correct when the replay finishes it: tests/parallel/test_pipeline_schedule.cpp
// replays every registered schedule over a grid of shapes.
//
// A stage (a pipeline rank) holds `virtual_stages` model chunks; chunk c of rank r is virtual
// stage c·stages + r of the stages·virtual_stages in the model's order (Megatron-LM's
// interleaving), so the activation of chunk c on the last rank goes to chunk c + 1 on rank 0.
// A compute action runs one pass of one (micro-batch, chunk): F (forward), B (the backward
// to the chunk's input), W (the backward to its weights) or BW (both at once).
//   gpipe             all forwards, then all backwards: M micro-batches alive.
//   1f1b              warm-up forwards (stages − stage − 1), then one forward / one backward,
//                     then the remaining backwards: at most stages − stage alive (the default).
//   interleaved_1f1b  Megatron-LM's interleaved 1F1B over v > 1 chunks per rank: the bubble
//                     shrinks v times, more micro-batches alive.
//   zb_h1             Qi et al.'s ZB-H1 (Zero Bubble Pipeline Parallelism, ICLR 2024): 1F1B with
//                     the backward split in B and W, the W passes deferred into the cool-down.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

// In the registry's order (schedules()); parallel.schedule's TOML names are the registry's.
enum class PipelineSchedule { one_f_one_b, gpipe, interleaved_1f1b, zb_h1 };

enum class ActionKind {
  recv_activation,  // from `peer`: the input of (micro-batch, chunk)
  compute,          // pass `pass` of (micro-batch, chunk)
  send_activation,  // to `peer`: the output of (micro-batch, chunk)
  recv_gradient,    // from `peer`: ∂loss/∂(output of (micro-batch, chunk))
  send_gradient,    // to `peer`: ∂loss/∂(input of (micro-batch, chunk))
};

// The passes of a compute action. B and W together are BW: a schedule that does not split the
// backward runs BW; one that does runs B (which the previous stage waits for) and later W.
enum class Pass { F, B, W, BW };

struct Action {
  ActionKind kind;
  int micro_batch;
  int chunk = 0;        // the model chunk on this stage (0 when the stage holds one)
  Pass pass = Pass::F;  // compute actions only
  // Transfers only: the stage at the other end, and the chunk there that sends or receives it
  // (the same chunk, except where the last rank's chunk c meets rank 0's chunk c + 1).
  int peer = -1;
  int peer_chunk = 0;
  bool operator==(const Action&) const = default;
};

inline bool is_receive(ActionKind k) {
  return k == ActionKind::recv_activation || k == ActionKind::recv_gradient;
}
inline bool is_send(ActionKind k) {
  return k == ActionKind::send_activation || k == ActionKind::send_gradient;
}

// One registered schedule: what config parsing, the planner, `bench pipeline` and the tests
// read. `generate` returns one stage's list; it may assume that `shape_error` found nothing.
struct ScheduleInfo {
  PipelineSchedule id;
  const char* name;           // parallel.schedule's value
  bool needs_virtual_stages;  // runs only with parallel.virtual_stages > 1 (and others only
                              // with 1)
  bool splits_weight_pass;    // its lists run B and W, not BW
  const char* summary;        // one line for --help-config and the docs
  std::vector<Action> (*generate)(int stages, int stage, int micro_batches, int virtual_stages);
};

// Every schedule, in PipelineSchedule's order.
std::span<const ScheduleInfo> schedules();
const ScheduleInfo& schedule_info(PipelineSchedule schedule);
const char* schedule_name(PipelineSchedule schedule);

// Why `schedule` has no list for this shape ("" when it has): a stage count, micro-batch count
// or chunk count it cannot take. Words name the quantity, not a configuration key.
std::string schedule_shape_error(PipelineSchedule schedule, int stages, int64_t micro_batches,
                                 int virtual_stages);

// Stage `stage`'s list; fails when schedule_shape_error says why not.
std::vector<Action> pipeline_schedule(PipelineSchedule schedule, int stages, int stage,
                                      int micro_batches, int virtual_stages = 1);
// Every stage's list: [stages].
std::vector<std::vector<Action>> pipeline_schedules(PipelineSchedule schedule, int stages,
                                                    int micro_batches, int virtual_stages = 1);

// The most (micro-batch, chunk) pairs alive at once on the stage of `actions`: a pair is alive
// from its F until its W (or BW) has run, since W still reads what F kept.
int peak_in_flight(const std::vector<Action>& actions);

// The idle fraction of a pipeline step by replay (schedule_replay.h) with unit costs per whole
// stage, F = B = W = 1 (BW = 2), each chunk's pass 1/virtual_stages of it, and no latency:
// (stages − 1)/(micro_batches + stages − 1) for gpipe and 1f1b.
double bubble_fraction(PipelineSchedule schedule, int stages, int micro_batches,
                       int virtual_stages = 1);

// "forward(3)", "backward(3)", "backward_input(3)", "backward_weight(3)", "recv_activation(3)";
// "forward(3, chunk 1)" where the chunk is not 0 (the peer is not printed).
std::string to_string(const Action& action);

}  // namespace bottle
