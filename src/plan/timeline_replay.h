#pragma once
// The rule `bottle plan` prices parallel.tp_overlap by (docs/design.md §22): a stage's timeline
// (plan/dry_run.h, StageCounts::tp_timeline), each event already priced, replayed on two
// resources. The rank's kernels run one after another in the order the dry run issued them;
// the TP group's link carries one call at a time, in issue order. A call starts when it is
// issued and the link is free; a blocking call, or the wait for a started one, holds the
// kernels until that call ends. While a call is on the link, kernels run `slowdown` times
// slower than alone (1 + the cluster's overlap.compute_slowdown): what moving the bytes takes
// from the cores or SMs that compute.
#include <cstdint>
#include <span>

namespace bottle {

struct TimedEvent {
  enum class Kind { work, issue, wait };
  Kind kind = Kind::work;
  double seconds = 0;    // work: its kernels alone; issue: the call on the link; wait: unused
  int64_t id = 0;        // issue, wait: the call
  bool started = false;  // issue: waited for later by a wait event of the same id
};

struct ReplayTimes {
  double kernels = 0;  // the work events' seconds alone, summed
  double calls = 0;    // the issue events' seconds, summed
  double stretch = 0;  // what running beside calls added to the kernels
  double end = 0;      // when the last kernel ends (a call the kernels never wait for is free)
  // Kernels held by calls: the communication the timeline leaves exposed.
  double exposed() const { return end - kernels - stretch; }
  // Calls' time that ran under kernels.
  double hidden() const { return calls > exposed() ? calls - exposed() : 0.0; }
};

// `slowdown` >= 1. Fails (an internal error) on a wait for a call never started, or waited
// twice.
ReplayTimes replay_timeline(std::span<const TimedEvent> events, double slowdown = 1.0);

}  // namespace bottle
