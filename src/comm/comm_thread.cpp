#include "comm/comm_thread.h"

#include <pthread.h>
#include <sched.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace bottle {
namespace {

// The thread wakes every few tens of microseconds to move a transfer on (MPI's TCP transport
// progresses only inside an MPI call) and goes back to sleep at once. Where the caller's ranks
// fill every core with their kernels, an ordinary thread's wake-up waits for the scheduler's
// next turn, a millisecond or more, and each call's rounds with it: on the emulated cluster
// the same collectives took 5-6x as long on this thread as blocking. So it asks to preempt the
// kernels when it wakes, as the driver's threads of a GPU's transfers do: the lowest real-time
// priority where the process may have one (root, or RLIMIT_RTPRIO), else a higher nice value
// than the compute threads, else nothing; and a timer slack of 1 ns, so that its short sleeps
// are as short as asked. It never spins (MpiCommunicator::wait sleeps between polls), so it
// takes the cores only for its polls.
void prefer_wakeups() {
  sched_param priority{};
  priority.sched_priority = 1;
  if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &priority) != 0)
    setpriority(PRIO_PROCESS, pid_t(syscall(SYS_gettid)), -10);  // refused unprivileged: kept
  prctl(PR_SET_TIMERSLACK, 1UL);
}

}  // namespace

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  posted_cv_.notify_one();
  thread_.join();
}

uint64_t CommThread::post(std::function<void()> task) {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    ticket = ++posted_;
    queue_.emplace_back(ticket, std::move(task));
  }
  posted_cv_.notify_one();
  return ticket;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return done_ >= ticket; });
  if (auto it = errors_.find(ticket); it != errors_.end()) {
    const std::exception_ptr error = it->second;
    errors_.erase(it);
    std::rethrow_exception(error);
  }
}

void CommThread::drain() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return done_ == posted_; });
  if (!errors_.empty()) {
    const std::exception_ptr error = errors_.begin()->second;
    errors_.clear();
    std::rethrow_exception(error);
  }
}

bool CommThread::busy() const {
  std::lock_guard lock(mutex_);
  return done_ != posted_;
}

void CommThread::run() {
  prefer_wakeups();
  std::unique_lock lock(mutex_);
  for (;;) {
    posted_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, with nothing left to run
    auto [ticket, task] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error) errors_.emplace(ticket, error);
    done_ = ticket;
    done_cv_.notify_all();
  }
}

}  // namespace bottle
