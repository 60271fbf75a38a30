// io/file_read.h: whole-file and line-by-line reads bounded before they happen. The type is
// checked without blocking (a FIFO is refused at once), the size before the read, and each line
// of a JSON Lines file as it is streamed; lines come back exactly, across the reader's chunks.
#include <sys/stat.h>

#include <fstream>
#include <random>

#include "core/error.h"
#include "io/file_read.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

std::vector<std::string> lines_of(const std::string& path, size_t max_line = 1 << 20) {
  std::vector<std::string> lines;
  int64_t expected = 1;
  for_each_bounded_line(path, "the test file", uint64_t(1) << 30, max_line,
                        [&](std::string_view line, int64_t number) {
                          EXPECT_EQ(number, expected++);
                          lines.emplace_back(line);
                        });
  return lines;
}

TEST(FileRead, LinesComeBackExactlyAcrossChunks) {
  TempDir dir;
  // About 1 MB of lines from 0 to 3000 bytes (the reader's chunks are 64 KiB), empty ones
  // included, the last without a newline.
  std::mt19937 rng(7);
  std::vector<std::string> written;
  std::string text;
  while (text.size() < (1 << 20)) {
    const size_t n = rng() % 8 == 0 ? 0 : rng() % 3000;
    std::string line(n, 'a');
    for (char& c : line) c = char('a' + rng() % 26);
    written.push_back(line);
    text += line + "\n";
  }
  written.push_back("the last, unterminated");
  text += written.back();
  std::ofstream(dir / "lines.jsonl", std::ios::binary) << text;
  EXPECT_EQ(lines_of(dir / "lines.jsonl"), written);
  // A file ending in a newline has no empty line after it.
  std::ofstream(dir / "two.jsonl") << "a\nb\n";
  EXPECT_EQ(lines_of(dir / "two.jsonl"), (std::vector<std::string>{"a", "b"}));
  std::ofstream(dir / "empty.jsonl");
  EXPECT_TRUE(lines_of(dir / "empty.jsonl").empty());
}

TEST(FileRead, ALineOverTheLimitIsRefusedByFileAndLine) {
  TempDir dir;
  std::ofstream(dir / "long.jsonl") << "short\n" << std::string(100, 'x') << "\nnever read\n";
  EXPECT_EQ(error_of([&] { lines_of(dir / "long.jsonl", 99); }),
            dir / "long.jsonl" +
                ":2: the test file has a line of more than 99 bytes, which no such file has; is "
                "it the right file?");
  EXPECT_EQ(lines_of(dir / "long.jsonl", 100).size(), 3u);
  // A sparse gigabyte of zeros (no newline) is refused within its first chunks.
  { std::ofstream(dir / "zeros.jsonl"); }
  fs::resize_file(dir / "zeros.jsonl", uint64_t(1) << 30);
  EXPECT_NE(error_of([&] { lines_of(dir / "zeros.jsonl"); }).find(":1: the test file has a line"),
            std::string::npos);
}

TEST(FileRead, WhatIsNotARegularFileOrTooLargeIsRefusedBeforeItIsRead) {
  TempDir dir;
  ASSERT_EQ(::mkfifo((dir / "fifo").c_str(), 0600), 0);
  const std::string fifo = dir / "fifo";
  EXPECT_NE(error_of([&] { lines_of(fifo); }).find("the test file is a FIFO"), std::string::npos);
  EXPECT_NE(error_of([&] {
              read_bounded_file(fifo, "config.json", 100);
            }).find(fifo + ": config.json is a FIFO, not a regular file"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_bounded_file("/dev/zero", "config.json", 100);
            }).find("config.json is a character device"),
            std::string::npos);
  std::ofstream(dir / "big.json") << std::string(101, ' ');
  EXPECT_NE(error_of([&] {
              read_bounded_file(dir / "big.json", "config.json", 100);
            }).find("config.json has 101 bytes, more than the 100 bytes"),
            std::string::npos);
  EXPECT_EQ(read_bounded_file(dir / "big.json", "config.json", 101), std::string(101, ' '));
  EXPECT_NE(error_of([&] { lines_of(dir / "none.jsonl"); }).find("cannot open the test file"),
            std::string::npos);
}

}  // namespace
}  // namespace bottle::testing
