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

#include <atomic>
#include <csignal>
#include <functional>
#include <optional>
#include <string>

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

// A training run's stop signals: SIGINT, SIGTERM, SIGHUP (a closed terminal or ssh session)
// and SIGUSR1 (what mpirun forwards without ending the job, and Slurm's --signal sends before a
// time limit) ask the loop to finish its step, checkpoint and exit 0. Made before the run is set
// up, so that a signal during the setup ends it cleanly too; while it lives the signals are read
// on a StopSignalWatcher's thread. The first one counts and says at once what the run leaves
// (the notice): under mpirun the launcher kills the ranks a few seconds after it forwarded a
// signal, and a run killed meanwhile must still have said which checkpoint it leaves. One at a
// time in a process.
class StopRequests {
 public:
  StopRequests();
  StopRequests(const StopRequests&) = delete;
  StopRequests& operator=(const StopRequests&) = delete;
  // After the run everything is saved and the process ends by itself (MPI_Finalize can take a
  // moment): a later stop signal is let pass, and a second one ends the process as it would
  // have.
  ~StopRequests();
  // The first stop signal received, 0: none.
  int requested() const { return signal_.load(); }
  // What the first signal prints at once (rank 0 only sets one): the main loop writes the text
  // into the buffer the watcher's thread does not read, then flips `current_`.
  void set_notice(const std::string& text);

 private:
  void on_signal(int sig);

  std::atomic<int> signal_{0};
  char text_[2][512] = {};
  size_t size_[2] = {};
  std::atomic<int> current_{-1};  // -1: nothing to say
  bool under_launcher_ = false;   // under mpirun, which ends the job soon after a SIGTERM
  std::optional<StopSignalWatcher> watcher_;
};

}  // namespace bottle
