// The launcher guard (launcher_guard.h).
#include "sys/launcher_guard.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/prctl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>
#include <string_view>

namespace bottle {
namespace {

// The write end of the pipe to the guard, held by the rank alone (close-on-exec, so that a
// program the rank starts does not keep it open). The guard reads a byte when the rank stands
// it down, and end of file when the rank is gone, however it went.
int guard_pipe = -1;

// The names a launcher that starts ranks on its own host goes by.
constexpr std::array<std::string_view, 4> kLaunchers = {"mpirun", "mpiexec", "orterun", "prterun"};

// What the guard needs, prepared before the fork: after it, in the child of a process that may
// have other threads, only async-signal-safe calls are allowed (no allocation, no stdio).
struct GuardPlan {
  pid_t launcher = 0;
  unsigned long long started = 0;  // the launcher's start time, in clock ticks after boot
  char stat_path[64] = {};
  char comm_path[64] = {};
  char stderr_path[64] = {};
  char message[384] = {};
  size_t message_size = 0;
};

// Reads up to size - 1 bytes of a small /proc file into buffer, NUL-terminated; the count, or
// -1. Async-signal-safe.
ssize_t read_small_file(const char* path, char* buffer, size_t size) {
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n;
  do {
    n = ::read(fd, buffer, size - 1);
  } while (n < 0 && errno == EINTR);
  ::close(fd);
  if (n < 0) return -1;
  buffer[n] = '\0';
  return n;
}

// The start time (field 22 of /proc/PID/stat) of a process that is still running, 0 when it
// is gone or a zombie (it has ended; only its parent has not reaped it yet). A pid with the
// same start time is the same process. Async-signal-safe.
unsigned long long start_time(const char* stat_path) {
  char text[1024];
  const ssize_t n = read_small_file(stat_path, text, sizeof text);
  if (n <= 0) return 0;
  // The command name (field 2) may hold spaces and parentheses: the fields after it follow the
  // last ')'. Field 3, the state, comes first.
  const char* p = nullptr;
  for (ssize_t i = n - 1; i >= 0; --i)
    if (text[i] == ')') {
      p = text + i + 2;
      break;
    }
  if (!p || p >= text + n || *p == 'Z' || *p == 'X') return 0;
  for (int field = 3; field < 22; ++p) {
    if (*p == '\0') return 0;
    if (*p == ' ') ++field;
  }
  unsigned long long value = 0;
  for (; *p >= '0' && *p <= '9'; ++p) value = value * 10 + unsigned(*p - '0');
  return value;
}

// The launcher's name when /proc/PID/comm names one, else empty. Async-signal-safe.
std::string_view launcher_name(const char* comm_path) {
  char name[32];
  ssize_t n = read_small_file(comm_path, name, sizeof name);
  if (n <= 0) return {};
  if (name[n - 1] == '\n') name[--n] = '\0';
  for (const std::string_view launcher : kLaunchers)
    if (std::string_view(name, size_t(n)) == launcher) return launcher;
  return {};
}

void pause_ms(long ms) {
  timespec pause{ms / 1000, (ms % 1000) * 1000000L};
  while (::nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

// The guard's whole life, in the forked child (async-signal-safe calls only).
[[noreturn]] void run_guard(const GuardPlan& plan, int from_rank) {
  // A session of its own: mpirun kills a rank by its process group, which must not include the
  // guard. Signals as a fresh process has them, so that `cluster.sh down` or a scheduler's
  // cleanup ends it like anything else.
  ::setsid();
  ::prctl(PR_SET_NAME, "bottle-guard", 0, 0, 0);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Nothing of the rank's stays open: the guard may outlive its rank by seconds, and whoever
  // reads the rank's output (mpirun, a pipe the user reads) must see its end with the rank's.
  if (from_rank != 3) {
    ::dup2(from_rank, 3);
    from_rank = 3;
  }
  if (::close_range(4, ~0U, 0) != 0)
    for (int fd = 4; fd < 4096; ++fd) ::close(fd);
  const int null = ::open("/dev/null", O_RDWR);
  if (null >= 0) {
    for (int fd = 0; fd <= 2; ++fd) ::dup2(null, fd);
    if (null > 3) ::close(null);
  }

  char byte;
  ssize_t n;
  do {
    n = ::read(from_rank, &byte, 1);
  } while (n < 0 && errno == EINTR);
  if (n != 0) ::_exit(0);  // stood down: the rank finished MPI

  // The rank ended without finishing MPI. mpirun ends a job it can reach within a second or
  // two; watch it, and leave as soon as it is gone.
  for (long waited = 0; waited < kLauncherGraceSeconds * 1000L; waited += 100) {
    if (start_time(plan.stat_path) != plan.started) ::_exit(0);
    pause_ms(100);
  }
  // Still the very launcher this rank was started by (same pid, same start time, a launcher's
  // name): nothing else is ever signalled.
  if (start_time(plan.stat_path) != plan.started || launcher_name(plan.comm_path).empty())
    ::_exit(0);
  const int err = ::open(plan.stderr_path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (err >= 0) {
    ssize_t ignored = ::write(err, plan.message, plan.message_size);
    (void)ignored;
    ::close(err);
  }
  ::kill(plan.launcher, SIGKILL);
  ::_exit(0);
}

}  // namespace

void start_launcher_guard() {
  if (guard_pipe >= 0) return;
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (!size || std::atoi(size) < 2) return;
  GuardPlan plan;
  plan.launcher = ::getppid();
  fmt::format_to_n(plan.stat_path, sizeof plan.stat_path - 1, "/proc/{}/stat", plan.launcher);
  fmt::format_to_n(plan.comm_path, sizeof plan.comm_path - 1, "/proc/{}/comm", plan.launcher);
  fmt::format_to_n(plan.stderr_path, sizeof plan.stderr_path - 1, "/proc/{}/fd/2", plan.launcher);
  const std::string_view name = launcher_name(plan.comm_path);
  if (name.empty()) return;  // a remote host's daemon, srun, a shell, ...
  plan.started = start_time(plan.stat_path);
  if (plan.started == 0) return;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string message = fmt::format(
      "bottle: error: {0} (pid {1}) had not ended the job {2} s after its rank {3} ended, as "
      "when a host it waits for does not answer (stopped, hung or cut off); ending {0} "
      "(SIGKILL) so that the job ends\n",
      name, plan.launcher, kLauncherGraceSeconds, rank ? rank : "?");
  plan.message_size = std::min(message.size(), sizeof plan.message);
  std::memcpy(plan.message, message.data(), plan.message_size);

  int ends[2];
  if (::pipe2(ends, O_CLOEXEC) != 0) return;  // no guard: the job runs as without one
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(ends[0]);
    ::close(ends[1]);
    return;
  }
  if (pid == 0) run_guard(plan, ends[0]);
  ::close(ends[0]);
  guard_pipe = ends[1];
}

void stand_down_launcher_guard() {
  if (guard_pipe < 0) return;
  const char done = 'd';
  ssize_t ignored = ::write(guard_pipe, &done, 1);
  (void)ignored;
  ::close(guard_pipe);
  guard_pipe = -1;
}

}  // namespace bottle
