#pragma once
// How the stop signals (SIGINT, SIGTERM, SIGHUP, SIGUSR1) reach a training run: never through a
// handler on a thread that computes. oneDNN's JIT f32 GEMM kernels (jit_avx512_common_gemm_f32
// and its AVX2 twin, in every oneDNN up to 3.11, Debian 12's 2.6 included) point rsp at a heap
// buffer while they run, so the kernel writes the frame of a handler delivered to that thread
// into the heap (oneDNN issue 4845, fixed by its pull request 4855), and glibc later aborts on the
// corrupted heap. That was issue 29's Ctrl-C crash: about 1 run in 20 with one signal, nearly
// every run with a burst of them.
//
// So the process blocks the stop signals before it starts any thread (every thread inherits the
// block), and while a run trains they stay blocked in every thread: a StopSignalWatcher reads them
// from a signalfd on a thread of its own, which runs no kernel. Nothing is interrupted either: no
// system call of any thread sees EINTR. Commands that do not train unblock them and take their
// default action (the process ends; no handler runs).
#include <pthread.h>

#include <csignal>
#include <functional>

namespace bottle {

// Blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 in the calling thread, so that threads it starts from
// now on are born with them blocked; a process forked meanwhile (Open MPI's singleton daemon)
// unblocks them before it execs, so that it still ends on a signal.
void block_stop_signals();
// Unblocks them in the calling thread only (signals that came meanwhile arrive now).
void unblock_stop_signals();
// The stop signals, for a child's posix_spawnattr_setsigmask / setsigdefault.
sigset_t stop_signal_set();

// While it lives, a thread of its own takes the stop signals sent to the process, one after
// another, and calls on_signal(sig) for each. The calling thread blocks them; every other thread
// must have them blocked too (main() blocks them before it starts any), or a signal can still land
// there. After it is gone a stop signal stays pending until a thread unblocks it.
class StopSignalWatcher {
 public:
  explicit StopSignalWatcher(std::function<void(int)> on_signal);
  StopSignalWatcher(const StopSignalWatcher&) = delete;
  StopSignalWatcher& operator=(const StopSignalWatcher&) = delete;
  ~StopSignalWatcher();

 private:
  void watch();

  std::function<void(int)> on_signal_;
  int signals_ = -1;  // signalfd of the stop signals
  int wake_ = -1;     // eventfd written by the destructor to end the thread
  pthread_t thread_{};
};

}  // namespace bottle
