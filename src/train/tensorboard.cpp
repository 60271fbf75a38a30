#include "train/tensorboard.h"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "core/error.h"

namespace bottle {
namespace {

// The protobuf wire format, for the few fields an Event needs.
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void key(std::string& out, int field, int wire_type) {
  varint(out, (uint64_t(field) << 3) | uint64_t(wire_type));
}
void fixed(std::string& out, const void* bytes, size_t n) {
  out.append(static_cast<const char*>(bytes), n);  // little-endian on every host bottle builds on
}
void length_delimited(std::string& out, int field, std::string_view bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out.append(bytes);
}

// Event { double wall_time = 1; int64 step = 2; string file_version = 3; Summary summary = 5;
// SessionLog session_log = 7; }
std::string event(int64_t step) {
  std::string e;
  const double wall =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  key(e, 1, 1);
  fixed(e, &wall, 8);
  key(e, 2, 0);
  varint(e, uint64_t(step));
  return e;
}

uint32_t masked(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

const std::array<uint32_t, 256>& crc_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? 0x82f63b78u ^ (c >> 1) : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  return table;
}

}  // namespace

uint32_t crc32c(std::string_view data) {
  uint32_t c = 0xffffffffu;
  for (const unsigned char b : data) c = crc_table()[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xffffffffu;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir, int64_t first_step) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  BOTTLE_CHECK(fs::is_directory(dir, ec), "{}: cannot create metrics.tensorboard's directory{}",
               dir, ec ? ": " + ec.message() : "");
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) std::strcpy(host.data(), "localhost");
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch())
                       .count();
  // A second run within the same second on the same host gets its own file.
  std::string name = fmt::format("events.out.tfevents.{}.{}", now, host.data());
  for (int n = 1; fs::exists(fs::path(dir) / name, ec); ++n)
    name = fmt::format("events.out.tfevents.{}.{}.{}", now, host.data(), n);
  path_ = (fs::path(dir) / name).string();
  out_.open(path_, std::ios::binary | std::ios::trunc);
  BOTTLE_CHECK(out_, "{}: cannot open for writing (metrics.tensorboard)", path_);
  std::string version = event(first_step);
  length_delimited(version, 3, "brain.Event:2");
  write_event(version);
  if (first_step > 0) {
    // SessionLog { status = START (1) } at the first step this run logs: TensorBoard keeps
    // of the earlier files only the steps before it (those the checkpoint holds).
    std::string start = event(first_step + 1), log;
    key(log, 1, 0);
    varint(log, 1);
    length_delimited(start, 7, log);
    write_event(start);
  }
  BOTTLE_CHECK(write_error_.empty(), "{}: write failed (metrics.tensorboard): {}", path_,
               write_error_);
}

void TensorBoardWriter::scalar(std::string_view tag, int64_t step, double value) {
  // Summary { repeated Value value = 1; } Value { string tag = 1; float simple_value = 2; }
  std::string v;
  length_delimited(v, 1, tag);
  const auto f = float(value);
  key(v, 2, 5);
  fixed(v, &f, 4);
  std::string summary;
  length_delimited(summary, 1, v);
  std::string e = event(step);
  length_delimited(e, 5, summary);
  write_event(e);
}

void TensorBoardWriter::write_event(const std::string& record) {
  if (!write_error_.empty()) return;
  std::string frame;
  const uint64_t length = record.size();
  fixed(frame, &length, 8);
  const uint32_t length_crc = masked(crc32c(frame));
  fixed(frame, &length_crc, 4);
  frame += record;
  const uint32_t data_crc = masked(crc32c(record));
  fixed(frame, &data_crc, 4);
  errno = 0;
  out_.write(frame.data(), std::streamsize(frame.size()));
  out_.flush();
  if (!out_) write_error_ = errno ? std::strerror(errno) : "write failed";
}

}  // namespace bottle
