#include "plan/timeline_replay.h"

#include <algorithm>
#include <map>

#include "core/error.h"

namespace bottle {

ReplayTimes replay_timeline(std::span<const TimedEvent> events) {
  ReplayTimes r;
  double link = 0;                 // when the link is next free
  std::map<int64_t, double> ends;  // a started call's end, until its wait
  for (const TimedEvent& e : events) {
    switch (e.kind) {
      case TimedEvent::Kind::work:
        r.end += e.seconds;
        r.kernels += e.seconds;
        break;
      case TimedEvent::Kind::issue:
        link = std::max(r.end, link) + e.seconds;
        r.calls += e.seconds;
        if (e.started)
          ends[e.id] = link;
        else
          r.end = link;
        break;
      case TimedEvent::Kind::wait: {
        const auto end = ends.find(e.id);
        BOTTLE_ASSERT(end != ends.end(), "timeline replay: a wait for call {}, which is not pending",
                      e.id);
        r.end = std::max(r.end, end->second);
        ends.erase(end);
        break;
      }
    }
  }
  return r;
}

}  // namespace bottle
