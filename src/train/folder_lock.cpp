#include "train/folder_lock.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <ctime>
#include <filesystem>

#include "core/error.h"

namespace bottle {

namespace {

// What the holder wrote into the lock file, read with a bound (the file is ours, but a user
// may have put anything there); "" when it is empty (the holder has not written it yet).
std::string holder_of(int fd) {
  char buf[512];
  const ssize_t n = ::pread(fd, buf, sizeof(buf) - 1, 0);
  if (n <= 0) return "";
  std::string text(buf, size_t(n));
  while (!text.empty() && (text.back() == '\n' || text.back() == '\0')) text.pop_back();
  return text;
}

// The holder writes who it is right after it takes the lock: a run that lost a race by a
// moment waits for that (up to 2 s) so that its message names the winner.
std::string holder_once_written(int fd) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    if (std::string text = holder_of(fd); !text.empty()) return text;
    ::usleep(20'000);
  }
  return "";
}

std::string this_host() {
  char host[256] = {};
  if (::gethostname(host, sizeof(host) - 1) != 0) return "an unknown host";
  return host;
}

}  // namespace

FolderLock::FolderLock(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / kFolderLockFile).string();
  // O_CLOEXEC: the plot's gnuplot child must not inherit (and so prolong) the lock. O_NOFOLLOW:
  // a symlink planted under the name must not make us truncate what it points to.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0)
    fail("{}: cannot create the lock file of checkpoint.folder: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail("{}: the lock file of checkpoint.folder is not a regular file", path);
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holder_once_written(fd_) : "";
    ::close(fd_);
    if (err != EWOULDBLOCK)
      fail("{}: cannot lock checkpoint.folder ({}): {}", folder, path, std::strerror(err));
    fail(
        "{}: checkpoint.folder is in use by another bottle train ({}); two runs in one folder "
        "would mix their checkpoints and metrics: wait for that run to end, or choose another "
        "checkpoint.folder",
        folder, holder.empty() ? "which is just starting" : holder);
  }
  // Ours now: record who holds it, for the message a second run gives.
  const std::time_t now = std::time(nullptr);
  char when[32] = {};
  std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  const std::string text =
      fmt::format("held by host {} pid {} since {}\n", this_host(), ::getpid(), when);
  if (::ftruncate(fd_, 0) != 0 ||
      ::pwrite(fd_, text.data(), text.size(), 0) != ssize_t(text.size())) {
    const int err = errno;
    ::close(fd_);
    fail("{}: cannot write the lock file of checkpoint.folder: {}", path, std::strerror(err));
  }
}

// The file stays: removing it would race a run that opens it as we leave, and take a lock on
// a file no longer in the folder. What it says is read only while somebody holds it.
FolderLock::~FolderLock() { ::close(fd_); }

}  // namespace bottle
