#pragma once
// Reading a user's file whole, bounded before the read happens. A path may name a FIFO (an
// open blocks until a writer comes, a read forever), a device (/dev/zero never ends) or a file
// far larger than any the reader expects (a 3 GB config.json would be read whole before a
// size check). Every reader of a whole file goes through here: the type and the size are
// checked first, without blocking, and at most `max_bytes` are ever read.
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>

namespace bottle {

// Limits of the files bottle reads whole; a file over its limit is refused by name.
inline constexpr uint64_t kMaxConfigFileBytes = uint64_t(100) << 20;    // JSON, TOML
inline constexpr uint64_t kMaxTokenizerFileBytes = uint64_t(1) << 30;   // tokenizer.json & co.
inline constexpr uint64_t kMaxTextInputBytes = uint64_t(4) << 30;       // tokenize --input
inline constexpr uint64_t kMaxJsonLinesFileBytes = uint64_t(16) << 30;  // metrics.jsonl
inline constexpr size_t kMaxJsonLineBytes = size_t(1) << 20;            // one metrics line

// Refuses, naming `path` and `what` (the file's role: "config.json", "the configuration
// file"), a path that does not exist, is not a regular file (a FIFO, device, socket or
// directory), or holds more than `max_bytes`; returns its size. Never opens the file, so a FIFO
// cannot block it.
uint64_t check_readable_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// The whole content of the regular file `path`, checked as above on the opened descriptor
// (which is opened without blocking) and read to at most `max_bytes`: a file that grows while
// it is read is refused rather than followed.
std::string read_bounded_file(const std::string& path, const std::string& what, uint64_t max_bytes);

// Calls on_line(text, number) for each line of the regular file `path` (number from 1, the
// newline not included), checked as read_bounded_file checks and streamed, so that a large
// file is never held whole. A line longer than `max_line_bytes` (a sparse file of zeros, a
// binary file) is refused by file and line number before more of it is read.
void for_each_bounded_line(const std::string& path, const std::string& what, uint64_t max_bytes,
                           size_t max_line_bytes,
                           const std::function<void(std::string_view, int64_t)>& on_line);

}  // namespace bottle
