#include "core/stop_signals.h"

#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "core/error.h"

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

}  // namespace bottle
