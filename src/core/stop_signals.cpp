#include "core/stop_signals.h"

#include <pthread.h>

#include <atomic>

namespace bottle {

namespace {

sigset_t stop_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR1);
  return set;
}

// In a child of fork(), which inherits the calling thread's mask: a program it execs would
// otherwise never see the stop signals.
extern "C" void unblock_in_child() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

}  // namespace

void block_stop_signals() {
  static const bool registered = pthread_atfork(nullptr, nullptr, &unblock_in_child) == 0;
  (void)registered;
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void unblock_stop_signals() {
  const sigset_t set = stop_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

void start_worker_threads() {
  // Each thread does something, so that the region stays: GCC drops an empty one (the function
  // compiled to a bare return), and the pool then started in the first real region, after
  // train had unblocked the signals, so that a Ctrl-C could land on an OpenMP worker in the
  // middle of a oneDNN GEMM (issue 29: heap corruption, about 1 run in 20).
  std::atomic<int> started{0};
#pragma omp parallel
  started.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace bottle
