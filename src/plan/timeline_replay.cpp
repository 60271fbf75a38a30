#include "plan/timeline_replay.h"

#include <algorithm>
#include <map>
#include <utility>
#include <vector>

#include "core/error.h"

namespace bottle {
namespace {

// When kernels of `work` seconds (alone) that start at `t` end, running `slowdown` times slower
// inside the link's busy intervals (in time order, none overlapping); `next` is the first
// interval that may still end after `t`, moved past those the kernels leave behind.
double run_kernels(double t, double work, double slowdown,
                   const std::vector<std::pair<double, double>>& busy, size_t& next) {
  while (work > 0) {
    while (next < busy.size() && busy[next].second <= t) ++next;
    if (next == busy.size()) return t + work;
    const auto [from, to] = busy[next];
    if (t < from) {  // free until the next call starts
      const double free = std::min(work, from - t);
      t += free;
      work -= free;
      continue;
    }
    const double beside = std::min(work * slowdown, to - t);  // wall time beside the call
    t += beside;
    work -= beside / slowdown;
  }
  return t;
}

}  // namespace

ReplayTimes replay_timeline(std::span<const TimedEvent> events, double slowdown) {
  BOTTLE_ASSERT(slowdown >= 1.0, "timeline replay: a slowdown of {} below 1", slowdown);
  ReplayTimes r;
  double link = 0;                              // when the link is next free
  std::vector<std::pair<double, double>> busy;  // [calls]: the link's busy intervals
  size_t next = 0;                              // the first of them not yet behind the kernels
  std::map<int64_t, double> ends;               // a started call's end, until its wait
  for (const TimedEvent& e : events) {
    switch (e.kind) {
      case TimedEvent::Kind::work: {
        if (slowdown > 1.0) {
          const double end = run_kernels(r.end, e.seconds, slowdown, busy, next);
          r.stretch += end - r.end - e.seconds;
          r.end = end;
        } else {
          r.end += e.seconds;
        }
        r.kernels += e.seconds;
        break;
      }
      case TimedEvent::Kind::issue: {
        const double start = std::max(r.end, link);
        link = start + e.seconds;
        if (e.seconds > 0) busy.emplace_back(start, link);
        r.calls += e.seconds;
        if (e.started)
          ends[e.id] = link;
        else
          r.end = link;
        break;
      }
      case TimedEvent::Kind::wait: {
        const auto end = ends.find(e.id);
        BOTTLE_ASSERT(end != ends.end(),
                      "timeline replay: a wait for call {}, which is not pending", e.id);
        r.end = std::max(r.end, end->second);
        ends.erase(end);
        break;
      }
    }
  }
  return r;
}

}  // namespace bottle
