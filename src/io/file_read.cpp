#include "io/file_read.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace bottle {

namespace {

// What a non-regular file is, for the message.
const char* file_kind(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

uint64_t check_stat(const struct stat& st, const std::string& path, const std::string& what,
                    uint64_t max_bytes) {
  BOTTLE_CHECK(S_ISREG(st.st_mode),
               "{}: {} is {}, not a regular file; bottle reads it only from "
               "a regular file",
               path, what, file_kind(st.st_mode));
  const uint64_t size = uint64_t(st.st_size);
  BOTTLE_CHECK(size <= max_bytes,
               "{}: {} has {} bytes, more than the {} bytes bottle reads for it; is it the right "
               "file?",
               path, what, size, max_bytes);
  return size;
}

// Closes the descriptor however the read ends.
struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

uint64_t check_readable_file(const std::string& path, const std::string& what, uint64_t max_bytes) {
  struct stat st {};
  BOTTLE_CHECK(::stat(path.c_str(), &st) == 0, "{}: cannot read {}: {}", path, what,
               std::strerror(errno));
  return check_stat(st, path, what, max_bytes);
}

namespace {

// Opens `path` into `f` for reading without blocking (a FIFO would wait for a writer) and checks
// the type and size on the descriptor itself, so that the file checked is the file read; returns
// the size.
uint64_t open_checked(Fd& f, const std::string& path, const std::string& what, uint64_t max_bytes) {
  f.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  BOTTLE_CHECK(f.fd >= 0, "{}: cannot open {}: {}", path, what, std::strerror(errno));
  struct stat st {};
  BOTTLE_CHECK(::fstat(f.fd, &st) == 0, "{}: cannot read {}: {}", path, what, std::strerror(errno));
  return check_stat(st, path, what, max_bytes);
}

}  // namespace

std::string read_bounded_file(const std::string& path, const std::string& what,
                              uint64_t max_bytes) {
  Fd f;
  const uint64_t size = open_checked(f, path, what, max_bytes);
  std::string bytes(size_t(size), '\0');
  size_t got = 0;
  // One byte more than the size: a file that grew meanwhile is noticed, not followed.
  char extra = 0;
  for (;;) {
    char* into = got < bytes.size() ? bytes.data() + got : &extra;
    const size_t want = got < bytes.size() ? bytes.size() - got : 1;
    const ssize_t n = ::read(f.fd, into, want);
    if (n < 0 && errno == EINTR) continue;
    BOTTLE_CHECK(n >= 0, "{}: reading {} failed: {}", path, what, std::strerror(errno));
    if (n == 0) break;
    BOTTLE_CHECK(got < bytes.size(), "{}: {} grew while it was read (past {} bytes); refusing it",
                 path, what, size);
    got += size_t(n);
  }
  // A file that shrank meanwhile is read as it now is.
  bytes.resize(got);
  return bytes;
}

void for_each_bounded_line(const std::string& path, const std::string& what, uint64_t max_bytes,
                           size_t max_line_bytes,
                           const std::function<void(std::string_view, int64_t)>& on_line) {
  Fd f;
  open_checked(f, path, what, max_bytes);
  std::string line;   // the line being read, up to max_line_bytes
  char chunk[65536];  // [64 KiB] of the file
  int64_t number = 1;
  uint64_t total = 0;
  auto too_long = [&] {
    fail(
        "{}:{}: {} has a line of more than {} bytes, which no such file has; is it the right "
        "file?",
        path, number, what, max_line_bytes);
  };
  for (;;) {
    const ssize_t n = ::read(f.fd, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    BOTTLE_CHECK(n >= 0, "{}: reading {} failed: {}", path, what, std::strerror(errno));
    if (n == 0) break;
    total += uint64_t(n);
    BOTTLE_CHECK(total <= max_bytes, "{}: {} grew while it was read (past {} bytes); refusing it",
                 path, what, max_bytes);
    std::string_view rest(chunk, size_t(n));
    for (size_t end; (end = rest.find('\n')) != std::string_view::npos;) {
      if (line.size() + end > max_line_bytes) too_long();
      line.append(rest.substr(0, end));
      on_line(line, number++);
      line.clear();
      rest.remove_prefix(end + 1);
    }
    if (line.size() + rest.size() > max_line_bytes) too_long();
    line.append(rest);
  }
  if (!line.empty()) on_line(line, number);
}

}  // namespace bottle
