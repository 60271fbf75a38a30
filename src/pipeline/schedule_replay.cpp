#include "pipeline/schedule_replay.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <tuple>

#include "core/error.h"

namespace bottle {
namespace {

// A message: (sender, sender's chunk, receiver, receiver's chunk, gradient, micro-batch).
using MessageKey = std::tuple<int, int, int, int, bool, int>;

double pass_seconds(const PassCosts& c, Pass pass) {
  switch (pass) {
    case Pass::F:
      return c.forward;
    case Pass::B:
      return c.backward_input;
    case Pass::W:
      return c.backward_weight;
    case Pass::BW:
      return c.backward;
  }
  return 0;
}

}  // namespace

double ReplayResult::bubble_fraction() const {
  if (makespan <= 0 || idle.empty()) return 0;
  double sum = 0;
  for (double t : idle) sum += t;
  return sum / (double(idle.size()) * makespan);
}

ReplayResult replay_schedule(const std::vector<std::vector<Action>>& lists,
                             const std::vector<PassCosts>& costs) {
  const int stages = int(lists.size());
  BOTTLE_ASSERT(costs.size() == lists.size(), "pipeline replay: {} stages' costs for {} stages",
                costs.size(), lists.size());
  ReplayResult r;
  r.busy.assign(size_t(stages), 0.0);
  std::vector<double> clock(size_t(stages), 0.0);
  std::vector<size_t> pc(size_t(stages), 0);
  std::map<MessageKey, double> arrival;  // messages sent and not yet received
  // Per (sender, receiver): the messages in the order they were sent, not yet received.
  std::map<std::pair<int, int>, std::deque<MessageKey>> channel;
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      const std::vector<Action>& list = lists[size_t(s)];
      const PassCosts& cost = costs[size_t(s)];
      for (; pc[size_t(s)] < list.size(); ++pc[size_t(s)], moved = true) {
        const Action& a = list[pc[size_t(s)]];
        if (a.kind == ActionKind::compute) {
          const double t = pass_seconds(cost, a.pass);
          clock[size_t(s)] += t;
          r.busy[size_t(s)] += t;
          continue;
        }
        if (a.peer < 0 || a.peer >= stages || a.peer == s)
          fail("pipeline replay: stage {}'s {} names peer stage {} (of {})", s, to_string(a),
               a.peer, stages);
        const bool gradient =
            a.kind == ActionKind::send_gradient || a.kind == ActionKind::recv_gradient;
        if (is_send(a.kind)) {
          const MessageKey key{s, a.chunk, a.peer, a.peer_chunk, gradient, a.micro_batch};
          const double latency = gradient ? cost.gradient_latency : cost.activation_latency;
          if (!arrival.emplace(key, clock[size_t(s)] + latency).second)
            fail("pipeline replay: stage {} sends {} to stage {} twice", s, to_string(a), a.peer);
          channel[{s, a.peer}].push_back(key);
          continue;
        }
        const MessageKey key{a.peer, a.peer_chunk, s, a.chunk, gradient, a.micro_batch};
        const auto it = arrival.find(key);
        if (it == arrival.end()) break;  // not sent yet: this stage waits
        clock[size_t(s)] = std::max(clock[size_t(s)], it->second);
        arrival.erase(it);
        std::deque<MessageKey>& queue = channel[{a.peer, s}];
        if (queue.front() != key) r.channels_in_order = false;
        queue.erase(std::find(queue.begin(), queue.end(), key));
      }
    }
  }
  std::string stuck;
  for (int s = 0; s < stages; ++s)
    if (pc[size_t(s)] < lists[size_t(s)].size()) {
      const Action& a = lists[size_t(s)][pc[size_t(s)]];
      stuck += fmt::format("{}stage {} at action {} ({} from stage {})", stuck.empty() ? "" : ", ",
                           s, pc[size_t(s)], to_string(a), a.peer);
    }
  if (!stuck.empty())
    fail("pipeline replay: deadlock: {}: each waits for a message that is never sent", stuck);
  if (!arrival.empty()) {
    const auto& [from, from_chunk, to, to_chunk, gradient, m] = arrival.begin()->first;
    fail(
        "pipeline replay: stage {} chunk {} sent the {} of micro-batch {} to stage {} chunk {}, "
        "which never receives it ({} messages unreceived)",
        from, from_chunk, gradient ? "gradient" : "activation", m, to, to_chunk, arrival.size());
  }
  r.makespan = *std::max_element(clock.begin(), clock.end());
  for (int s = 0; s < stages; ++s) r.idle.push_back(r.makespan - r.busy[size_t(s)]);
  return r;
}

ReplayResult replay_schedule(const std::vector<std::vector<Action>>& lists,
                             const PassCosts& costs) {
  return replay_schedule(lists, std::vector<PassCosts>(lists.size(), costs));
}

double pipeline_makespan(PipelineSchedule schedule, int stages, int64_t micro_batches,
                         int virtual_stages, const std::vector<PassCosts>& costs,
                         int64_t exact_up_to) {
  auto replay = [&](int64_t m) {
    return replay_schedule(pipeline_schedules(schedule, stages, int(m), virtual_stages), costs)
        .makespan;
  };
  const int64_t bound = std::max<int64_t>(exact_up_to, 8 * int64_t(stages));
  if (micro_batches <= bound) return replay(micro_batches);
  // Two steps whose micro-batch counts are multiples of the stages (interleaving's groups).
  const int64_t high = bound / stages * stages, low = high - stages;
  const double t_low = replay(low), t_high = replay(high);
  return t_high + double(micro_batches - high) * (t_high - t_low) / double(stages);
}

}  // namespace bottle
