#pragma once
// Outputs that appear whole or not at all. A command's output (export's and lowrank's model
// directory, a plot, a report) is written under a temporary name beside its destination, on
// the same file system, and renamed into place once complete: a full disk, a write error or a
// failed tool leaves no partial copy that a retry would be refused over ("not empty") or that
// a reader would take for the real thing. A failure removes the temporary copy and says so.
// (A process killed outright leaves it, named .NAME.partial-PID, beside the destination.)
#include <functional>
#include <string>
#include <string_view>

namespace bottle {

// Refuses, naming `path` and `what` it is (e.g. "plan --calibrate's cluster file"), an existing
// path that is not a regular file: a device, a FIFO, a directory or a socket. Every output
// renamed into place would replace it (mknod'ed /dev/full turned into a plain file), so each
// command checks its outputs this way before any work. A missing path passes.
void check_output_file(const std::string& path, std::string_view what);

// The same for an output directory: an existing path that is not a directory is refused.
void check_output_directory(const std::string& path, std::string_view what);

// The temporary name beside `path`: PARENT/.NAME.partial-PID.
std::string partial_path(const std::string& path);

// `write` fills a new directory at the path it is given (it creates it); once it returns, that
// directory replaces `dir`, which must be missing or empty. Errors name `dir`.
void write_directory_atomically(const std::string& dir,
                                const std::function<void(const std::string& temp)>& write);

// `write` writes one file at the path it is given; once it returns, the file replaces `path`,
// which must be missing or a regular file (check_output_file; checked again before the rename).
void write_file_atomically(const std::string& path,
                           const std::function<void(const std::string& temp)>& write);

// `bytes` as the whole of the file `path`, written the same way.
void write_file_atomically(const std::string& path, std::string_view bytes);

// Flushes the file or directory `path` to the disk (fsync): a file's bytes before it is renamed
// into place, a directory's renames and removals after, so that both survive a power cut, and
// a disk that fills late (delayed allocation) fails here rather than after the rename. Errors
// name `path`.
void fsync_path(const std::string& path);

}  // namespace bottle
