#include "io/atomic_output.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "core/error.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// What `st` is, for an error: "a character device", "a FIFO", ...
const char* kind_of(const fs::file_status& st) {
  switch (st.type()) {
    case fs::file_type::directory:
      return "a directory";
    case fs::file_type::character:
      return "a character device";
    case fs::file_type::block:
      return "a block device";
    case fs::file_type::fifo:
      return "a FIFO";
    case fs::file_type::socket:
      return "a socket";
    case fs::file_type::regular:
      return "a regular file";
    default:
      return "not a regular file";
  }
}

}  // namespace

void check_output_file(const std::string& path, std::string_view what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail("{}: {} cannot be written: {}", path, what, ec.message());
  if (!fs::exists(st) || fs::is_regular_file(st)) return;
  fail(
      "{}: {} must be a regular file, and this is {}: bottle never replaces it; name a new or "
      "regular file",
      path, what, kind_of(st));
}

void check_output_directory(const std::string& path, std::string_view what) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec && ec != std::errc::no_such_file_or_directory)
    fail("{}: {} cannot be written: {}", path, what, ec.message());
  if (!fs::exists(st) || fs::is_directory(st)) return;
  fail(
      "{}: {} must be a directory, and this is {}: bottle never replaces it; name a new or "
      "empty directory",
      path, what, kind_of(st));
}

std::string partial_path(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "out/"
  return (p.parent_path() / fmt::format(".{}.partial-{}", p.filename().string(), ::getpid()))
      .string();
}

namespace {

// Runs `write` into `temp`, then `publish`; on any failure removes `temp` and fails with the
// cause and what became of the partial copy.
void write_then_publish(const std::string& destination, const std::string& temp,
                        const std::function<void(const std::string&)>& write,
                        const std::function<void()>& publish) {
  std::string cause;
  try {
    write(temp);
    publish();
    return;
  } catch (const Error& e) {
    cause = e.what();
  } catch (const std::exception& e) {
    cause = e.what();
  }
  std::error_code ec;
  fs::remove_all(temp, ec);
  fail("{}{}; {} was not written: {}", cause,
       ec ? fmt::format(" (the partial copy {} could not be removed: {})", temp, ec.message())
          : fmt::format(" (the partial copy {} was removed)", temp),
       destination, "nothing of it is left, so the same command can be run again");
}

}  // namespace

void write_directory_atomically(const std::string& dir,
                                const std::function<void(const std::string& temp)>& write) {
  check_output_directory(dir, "the output");
  const std::string temp = partial_path(dir);
  std::error_code ec;
  fs::remove_all(temp, ec);  // a leftover of an earlier process with our pid
  write_then_publish(dir, temp, write, [&] {
    // rename(2) replaces an empty directory, and refuses one that something filled meanwhile.
    fs::rename(temp, dir, ec);
    BOTTLE_CHECK(!ec, "{}: cannot move the written copy {} into place: {}", dir, temp,
                 ec.message());
  });
}

void write_file_atomically(const std::string& path,
                           const std::function<void(const std::string& temp)>& write) {
  check_output_file(path, "the output");
  const std::string temp = partial_path(path);
  write_then_publish(path, temp, write, [&] {
    // Again at the rename: what took the name meanwhile is not replaced either.
    check_output_file(path, "the output");
    std::error_code ec;
    fs::rename(temp, path, ec);
    BOTTLE_CHECK(!ec, "{}: cannot move the written copy {} into place: {}", path, temp,
                 ec.message());
  });
}

void write_file_atomically(const std::string& path, std::string_view bytes) {
  write_file_atomically(path, [&](const std::string& temp) {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    BOTTLE_CHECK(out, "{}: cannot open for writing", temp);
    out.write(bytes.data(), std::streamsize(bytes.size()));
    out.close();
    BOTTLE_CHECK(out, "{}: write failed (disk full?)", temp);
  });
}

void fsync_path(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  BOTTLE_CHECK(fd >= 0, "{}: cannot open to sync: {}", path, std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  BOTTLE_CHECK(rc == 0, "{}: fsync failed: {}", path, std::strerror(err));
}

}  // namespace bottle
