#pragma once
// The thread that runs one group's started calls (Communicator::start_*), one after another in
// the order they were issued, while the caller computes. Open MPI over TCP moves a message only
// while some thread is inside an MPI call (it has no progress thread of its own for TCP, and a
// multi-round all-reduce needs someone to issue each round), so a call left to the caller's
// thread would wait for the next collective anyway: this thread is inside MPI while the
// caller's cores run GEMMs. It needs MPI_THREAD_MULTIPLE, as the caller's thread keeps calling
// MPI on other groups meanwhile.
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

namespace bottle {

class CommThread {
 public:
  CommThread();
  // Runs what is queued, then stops.
  ~CommThread();
  CommThread(const CommThread&) = delete;
  CommThread& operator=(const CommThread&) = delete;

  // Queues `task`; returns its ticket, for wait().
  uint64_t post(std::function<void()> task);
  // Until the task of `ticket` has run (at once when it has); rethrows what it threw.
  void wait(uint64_t ticket);
  // Until every queued task has run; rethrows the first error nobody waited for.
  void drain();
  // Whether tasks are queued or running: a blocking call must drain() first.
  bool busy() const;

 private:
  void run();

  mutable std::mutex mutex_;
  std::condition_variable posted_cv_, done_cv_;
  std::deque<std::pair<uint64_t, std::function<void()>>> queue_;
  uint64_t posted_ = 0, done_ = 0;                 // tickets issued and tickets run, in order
  std::map<uint64_t, std::exception_ptr> errors_;  // tasks that threw, until waited for
  bool stopping_ = false;
  std::thread thread_;  // last: started once the members above exist
};

}  // namespace bottle
