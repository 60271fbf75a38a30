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

// Opens the lock file and locks it, or fails naming the holder.
void FolderLock::lock_once(const LockSubject& subject) {
  const std::string& path = path_;
  const std::string& name = subject.name;
  // O_CLOEXEC: the plot's gnuplot child must not inherit (and so prolong) the lock. O_NOFOLLOW:
  // a symlink planted under the name must not make us truncate what it points to.
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) fail("{}: cannot create the lock file of {}: {}", path, name, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd_);
    fail("{}: the lock file of {} is not a regular file", path, name);
  }
  device_ = st.st_dev;
  inode_ = st.st_ino;
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    const std::string holder = err == EWOULDBLOCK ? holder_once_written(fd_) : "";
    ::close(fd_);
    if (err != EWOULDBLOCK)
      fail("{}: cannot lock {} ({}): {}", subject.target, name, path, std::strerror(err));
    fail("{}: {} is in use by another {} ({}); {}: wait for that run to end, or choose another {}",
         subject.target, name, subject.holder, holder.empty() ? "which is just starting" : holder,
         subject.why, name);
  }
}

FolderLock::FolderLock(const std::string& folder)
    : FolderLock((std::filesystem::path(folder) / kFolderLockFile).string(),
                 {"checkpoint.folder", folder, "bottle train",
                  "two runs in one folder would mix their checkpoints and metrics"}) {}

FolderLock::FolderLock(const std::string& lock_path, const LockSubject& subject)
    : path_(lock_path), remove_when_released_(subject.remove_when_released) {
  // A holder that removes its lock file as it ends (remove_when_released) may unlink the file
  // we opened just before we lock it: a lock on a file no longer under the name is no lock, so
  // it is taken again on the file there now.
  for (int attempt = 0; attempt < 100; ++attempt) {
    lock_once(subject);
    if (lost().empty()) break;
    ::close(fd_);
    fd_ = -1;
  }
  BOTTLE_CHECK(fd_ >= 0, "{}: cannot lock {} ({}): its lock file keeps being replaced",
               subject.target, subject.name, path_);
  const std::string& path = path_;
  const std::string& name = subject.name;
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
    fail("{}: cannot write the lock file of {}: {}", path, name, std::strerror(err));
  }
}

std::string FolderLock::lost() const {
  struct stat st {};
  if (::stat(path_.c_str(), &st) != 0)
    return fmt::format("its lock file {} is gone ({})", path_, std::strerror(errno));
  if (st.st_dev == device_ && st.st_ino == inode_) return "";
  // Another file under the name: most likely another run's lock, which says who holds it.
  std::string holder;
  if (const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW); fd >= 0) {
    holder = holder_of(fd);
    ::close(fd);
  }
  return fmt::format("its lock file {} is another file now{}", path_,
                     holder.empty() ? std::string() : ", which says " + holder);
}

// The folder's lock file stays (what it says is read only while somebody holds it). One
// removed as it is released is removed while still held, and only while it is ours: a run
// that opened it meanwhile finds its lock on a file no longer under the name and takes it
// again (the constructor's loop).
FolderLock::~FolderLock() {
  if (remove_when_released_ && lost().empty()) ::unlink(path_.c_str());
  ::close(fd_);
}

}  // namespace bottle
