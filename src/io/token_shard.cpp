#include "io/token_shard.h"

#include <climits>
#include <fstream>

#include "core/error.h"
#include "io/file_read.h"

namespace bottle {

namespace {

// Opens a shard and returns its size in bytes.
uint64_t open_shard(std::ifstream& in, const std::string& path) {
  // Before the open: a FIFO would block it, /dev/zero never end. A shard holds at most
  // INT32_MAX tokens of 4 bytes after its header.
  check_readable_file(path, "the token shard", 1024 + uint64_t(INT32_MAX) * 4);
  in.open(path, std::ios::binary);
  BOTTLE_CHECK(in, "{}: cannot open token shard", path);
  in.seekg(0, std::ios::end);
  const uint64_t size = uint64_t(in.tellg());
  in.seekg(0);
  return size;
}

// Reads a shard's header and checks it against the size; returns the token width.
size_t read_header(std::istream& in, uint64_t size, const std::string& path,
                   int32_t (&header)[256]) {
  BOTTLE_CHECK(size >= sizeof(header) && in.read(reinterpret_cast<char*>(header), sizeof(header)),
               "{}: token shard is shorter than its 1024-byte header ({} bytes)", path, size);
  size_t width = 0;
  if (header[0] == kShardMagicU16 && header[1] == kShardVersionU16) width = 2;
  if (header[0] == kShardMagicU32 && header[1] == kShardVersionU32) width = 4;
  BOTTLE_CHECK(width != 0, "{}: not a token shard (magic {} version {}; expected {}/{} or {}/{})",
               path, header[0], header[1], kShardMagicU16, kShardVersionU16, kShardMagicU32,
               kShardVersionU32);
  BOTTLE_CHECK(
      header[2] >= 0 && size == sizeof(header) + uint64_t(header[2]) * width,
      "{}: token shard header says {} tokens of {} bytes but the file has {} bytes (truncated?)",
      path, header[2], width, size);
  return width;
}

}  // namespace

uint64_t token_shard_size(const std::string& path) {
  std::ifstream in;
  const uint64_t size = open_shard(in, path);
  int32_t header[256];
  read_header(in, size, path, header);
  return uint64_t(header[2]);
}

std::vector<int32_t> read_token_shard(std::istream& in, uint64_t size, const std::string& path) {
  int32_t header[256];
  const size_t width = read_header(in, size, path, header);
  std::vector<int32_t> tokens(static_cast<size_t>(header[2]));
  if (width == 4) {
    in.read(reinterpret_cast<char*>(tokens.data()), std::streamsize(tokens.size() * 4));
  } else {
    std::vector<uint16_t> raw(tokens.size());
    in.read(reinterpret_cast<char*>(raw.data()), std::streamsize(raw.size() * 2));
    for (size_t i = 0; i < raw.size(); ++i) tokens[i] = raw[i];
  }
  BOTTLE_CHECK(in, "{}: read failed", path);
  return tokens;
}

std::vector<int32_t> read_token_shard(const std::string& path) {
  std::ifstream in;
  const uint64_t size = open_shard(in, path);
  return read_token_shard(in, size, path);
}

std::array<int32_t, 256> token_shard_header(uint64_t count, int width) {
  BOTTLE_CHECK(width == 2 || width == 4, "token shard width {} (expected 2 or 4 bytes)", width);
  BOTTLE_CHECK(count <= uint64_t(INT32_MAX),
               "{} tokens do not fit one token shard (its header counts at most {})", count,
               INT32_MAX);
  std::array<int32_t, 256> header{};
  header[0] = width == 2 ? kShardMagicU16 : kShardMagicU32;
  header[1] = width == 2 ? kShardVersionU16 : kShardVersionU32;
  header[2] = int32_t(count);
  return header;
}

void write_token_shard(const std::string& path, std::span<const int32_t> tokens, int width) {
  const auto header = token_shard_header(tokens.size(), width);
  if (width == 2)
    for (int32_t t : tokens)
      BOTTLE_CHECK(t >= 0 && t < 65536, "{}: token {} does not fit a 16-bit token shard", path, t);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  BOTTLE_CHECK(out, "{}: cannot open for writing", path);
  out.write(reinterpret_cast<const char*>(header.data()), sizeof(header));
  if (width == 2) {
    std::vector<uint16_t> raw(tokens.begin(), tokens.end());
    out.write(reinterpret_cast<const char*>(raw.data()), std::streamsize(raw.size() * 2));
  } else {
    out.write(reinterpret_cast<const char*>(tokens.data()), std::streamsize(tokens.size() * 4));
  }
  out.flush();
  BOTTLE_CHECK(out, "{}: write failed", path);
}

void write_token_shard(const std::string& path, const std::vector<int32_t>& tokens) {
  bool fits16 = true;
  for (int32_t t : tokens) fits16 &= (t >= 0 && t < 65536);
  write_token_shard(path, tokens, fits16 ? 2 : 4);
}

}  // namespace bottle
