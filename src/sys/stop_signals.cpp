#include "sys/stop_signals.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"
#include "sys/system_info.h"

namespace bottle {

namespace {

// In a child of fork(), which inherits the calling thread's mask: a program it execs would
// otherwise never see the stop signals.
extern "C" void unblock_in_child() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

}  // namespace

sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  sigaddset(&set, SIGUSR1);
  return set;
}

void block_stop_signals() {
  static const bool registered = pthread_atfork(nullptr, nullptr, &unblock_in_child) == 0;
  (void)registered;
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

void unblock_stop_signals() {
  const sigset_t set = stop_signal_set();
  pthread_sigmask(SIG_UNBLOCK, &set, nullptr);
}

StopSignalWatcher::StopSignalWatcher(std::function<void(int)> on_signal)
    : on_signal_(std::move(on_signal)) {
  block_stop_signals();  // before the thread starts: it inherits the block
  const sigset_t set = stop_signal_set();
  signals_ = ::signalfd(-1, &set, SFD_CLOEXEC);
  if (signals_ < 0) fail("cannot watch the stop signals: signalfd: {}", std::strerror(errno));
  wake_ = ::eventfd(0, EFD_CLOEXEC);
  if (wake_ < 0) {
    const int error = errno;
    ::close(signals_);
    fail("cannot watch the stop signals: eventfd: {}", std::strerror(error));
  }
  // A small stack of its own (it polls, reads and writes): under an address-space limit
  // (ulimit -v) a default 8 MiB one may not fit, and the run should meet that limit where its
  // memory is planned, with a message that says so.
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, size_t(256) << 10);
  const int error = pthread_create(
      &thread_, &attributes,
      [](void* self) -> void* {
        static_cast<StopSignalWatcher*>(self)->watch();
        return nullptr;
      },
      this);
  pthread_attr_destroy(&attributes);
  if (error != 0) {
    ::close(signals_);
    ::close(wake_);
    fail("cannot start the thread that watches the stop signals: {}", std::strerror(error));
  }
}

StopSignalWatcher::~StopSignalWatcher() {
  const uint64_t one = 1;
  ssize_t ignored = ::write(wake_, &one, sizeof(one));
  (void)ignored;
  pthread_join(thread_, nullptr);
  ::close(signals_);
  ::close(wake_);
}

void StopSignalWatcher::watch() {
  pthread_setname_np(pthread_self(), "stop signals");
  pollfd fds[2] = {{signals_, POLLIN, 0}, {wake_, POLLIN, 0}};
  for (;;) {
    // poll is not restarted after a signal, but none reaches this thread (all are blocked).
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      const std::string line = fmt::format(
          "bottle: the stop signals are no longer watched (poll: {}); a Ctrl-C will wait for the "
          "run to end\n",
          std::strerror(errno));
      ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
      (void)ignored;
      return;
    }
    if (fds[1].revents) return;
    signalfd_siginfo info{};
    if (::read(signals_, &info, sizeof(info)) == ssize_t(sizeof(info)))
      on_signal_(int(info.ssi_signo));
  }
}

namespace {

// Once the run is over a handler is safe again (no GEMM runs after it): the first stop signal
// restores the default action, so that a second one ends the process as it would have.
extern "C" void on_stop_signal_after_run(int sig) {
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
}

}  // namespace

StopRequests::StopRequests() : under_launcher_(launched_by_mpirun()) {
  watcher_.emplace([this](int sig) { on_signal(sig); });
}

StopRequests::~StopRequests() {
  current_.store(-1);
  watcher_.reset();
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal_after_run;
  sigemptyset(&sa.sa_mask);
  for (const int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaction(sig, &sa, nullptr);
  unblock_stop_signals();  // one that came after the watcher ended is let pass here
}

void StopRequests::set_notice(const std::string& text) {
  const int next = current_.load() == 0 ? 1 : 0;
  const size_t n = std::min(text.size(), sizeof(text_[next]));
  std::copy_n(text.data(), n, text_[next]);
  size_[next] = n;
  current_.store(next);
}

// On the watcher's thread: the first stop signal asks the loop to stop and says at once what it
// leaves; later ones change nothing.
void StopRequests::on_signal(int sig) {
  int expected = 0;
  if (!signal_.compare_exchange_strong(expected, sig)) return;
  if (const int i = current_.load(); i >= 0) {
    // write(2), not stdio: the main thread may be in the middle of a line of its own.
    const char head[] = "bottle: stop signal received: ";
    ssize_t ignored = ::write(STDERR_FILENO, head, sizeof(head) - 1);
    ignored = ::write(STDERR_FILENO, text_[i], size_[i]);
    if (under_launcher_ && sig != SIGUSR1) {
      const char hint[] =
          "bottle: mpirun ends the job a few seconds after forwarding this signal, which can cut "
          "the save short; to stop with a checkpoint, send SIGUSR1 to mpirun (kill -USR1 "
          "MPIRUN_PID), which it forwards and then waits\n";
      ignored = ::write(STDERR_FILENO, hint, sizeof(hint) - 1);
    }
    (void)ignored;
  }
}

}  // namespace bottle
