// Starting another program (subprocess.h).
#include "sys/subprocess.h"

#include <fcntl.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "core/error.h"
#include "sys/stop_signals.h"

extern char** environ;

namespace bottle {
namespace {

// Closes a file descriptor when it goes out of scope.
class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  ~FileDescriptor() {
    if (fd_ >= 0) ::close(fd_);
  }
  int get() const { return fd_; }

 private:
  int fd_;
};

// The child's signals and process group, destroyed however the spawn ends.
class SpawnAttributes {
 public:
  explicit SpawnAttributes(bool own_process_group) {
    ::posix_spawnattr_init(&attributes_);
    short flags = POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF;
    if (own_process_group) flags |= POSIX_SPAWN_SETPGROUP;
    ::posix_spawnattr_setflags(&attributes_, flags);
    if (own_process_group) ::posix_spawnattr_setpgroup(&attributes_, 0);  // led by the child
    sigset_t none;
    sigemptyset(&none);
    ::posix_spawnattr_setsigmask(&attributes_, &none);
    const sigset_t stop = stop_signal_set();
    ::posix_spawnattr_setsigdefault(&attributes_, &stop);
  }
  SpawnAttributes(const SpawnAttributes&) = delete;
  SpawnAttributes& operator=(const SpawnAttributes&) = delete;
  ~SpawnAttributes() { ::posix_spawnattr_destroy(&attributes_); }
  posix_spawnattr_t* get() { return &attributes_; }

 private:
  posix_spawnattr_t attributes_;
};

// What posix_spawn does to the child's descriptors, destroyed however the spawn ends.
class SpawnActions {
 public:
  SpawnActions() { ::posix_spawn_file_actions_init(&actions_); }
  SpawnActions(const SpawnActions&) = delete;
  SpawnActions& operator=(const SpawnActions&) = delete;
  ~SpawnActions() { ::posix_spawn_file_actions_destroy(&actions_); }
  posix_spawn_file_actions_t* get() { return &actions_; }

 private:
  posix_spawn_file_actions_t actions_;
};

// Everything written to `fd` from its start.
std::string read_all(int fd, const std::string& program) {
  std::string text;
  BOTTLE_CHECK(::lseek(fd, 0, SEEK_SET) == 0, "{}: cannot read its output back ({})", program,
               std::strerror(errno));
  char buffer[4096];
  for (ssize_t n; (n = ::read(fd, buffer, sizeof(buffer))) != 0;) {
    if (n < 0) {
      BOTTLE_CHECK(errno == EINTR, "{}: cannot read its output back ({})", program,
                   std::strerror(errno));
      continue;
    }
    text.append(buffer, size_t(n));
  }
  return text;
}

}  // namespace

bool ProcessResult::succeeded() const {
  return started() && WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0;
}

std::string ProcessResult::ending() const {
  if (!started()) return fmt::format("did not start ({})", std::strerror(start_error));
  if (WIFSIGNALED(wait_status)) return fmt::format("killed by signal {}", WTERMSIG(wait_status));
  return fmt::format("exit status {}", WEXITSTATUS(wait_status));
}

ProcessResult run_process(const ProcessRun& run) {
  BOTTLE_CHECK(!run.argv.empty(), "run_process: no program to run");
  const std::string& program = run.argv.front();
  const FileDescriptor output(::memfd_create("bottle-child-output", MFD_CLOEXEC));
  BOTTLE_CHECK(output.get() >= 0, "{}: no file for its output ({})", program, std::strerror(errno));
  SpawnActions actions;
  ::posix_spawn_file_actions_addopen(actions.get(), STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  ::posix_spawn_file_actions_adddup2(actions.get(), output.get(), STDOUT_FILENO);
  if (run.capture_stderr)
    ::posix_spawn_file_actions_adddup2(actions.get(), output.get(), STDERR_FILENO);
  SpawnAttributes attributes(run.own_process_group);
  std::vector<std::string> args = run.argv;  // posix_spawn takes char*, never writes them
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  ProcessResult result;
  pid_t pid = -1;
  result.start_error =
      ::posix_spawnp(&pid, program.c_str(), actions.get(), attributes.get(), argv.data(), environ);
  if (!result.started()) return result;
  while (::waitpid(pid, &result.wait_status, 0) < 0)
    BOTTLE_CHECK(errno == EINTR, "{}: lost the process ({})", program, std::strerror(errno));
  result.output = read_all(output.get(), program);
  return result;
}

}  // namespace bottle
