#include "data/shard_writer.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstring>

#include "io/atomic_output.h"
#include "core/error.h"
#include "io/token_shard.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// Tokens converted per fwrite: 64 Ki tokens, at most 256 KiB of staging.
constexpr size_t kStagingTokens = size_t(1) << 16;

// The shard number of `name` when it is <stem>NNNNNN<ext> (six digits or more), else -1.
int64_t shard_number(std::string_view name, std::string_view stem, std::string_view ext) {
  if (!name.starts_with(stem) || !name.ends_with(ext)) return -1;
  const std::string_view digits = name.substr(stem.size(), name.size() - stem.size() - ext.size());
  if (digits.size() < 6 || digits.size() > 12 ||
      !std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; }))
    return -1;
  return std::stoll(std::string(digits));
}

}  // namespace

ShardWriter::ShardWriter(fs::path dir, std::string prefix, std::string split, int64_t max_tokens,
                         int64_t vocab_size)
    : dir_(std::move(dir)), prefix_(std::move(prefix)), split_(std::move(split)) {
  BOTTLE_CHECK(max_tokens >= 1 && max_tokens <= INT32_MAX,
               "{} tokens per shard: must be in [1, {}] (the shard header counts in int32)",
               max_tokens, INT32_MAX);
  BOTTLE_CHECK(vocab_size >= 1 && vocab_size <= int64_t(INT32_MAX) + 1,
               "vocabulary of {} ids: token shards hold ids in [0, 2^31)", vocab_size);
  BOTTLE_CHECK(!prefix_.empty() && !split_.empty(), "a shard name needs a prefix and a split");
  BOTTLE_CHECK(fs::is_directory(dir_), "{}: not a directory", dir_.string());
  max_tokens_ = uint64_t(max_tokens);
  width_ = shard_token_width(vocab_size);
  meta_.split = split_;
  meta_.vocab_size = vocab_size;
}

ShardWriter::~ShardWriter() {
  if (committed_) return;
  file_.reset();
  // A split not committed leaves nothing behind: its files never got their real names.
  std::error_code ec;
  for (size_t i = 0; i <= meta_.shards.size(); ++i) fs::remove(temp_path(i), ec);
  if (staged_) fs::remove(temp_meta_path(), ec);
}

fs::path ShardWriter::shard_path(size_t index) const {
  return dir_ / fmt::format("{}_{}_{:06d}.bin", prefix_, split_, index);
}

fs::path ShardWriter::temp_path(size_t index) const {
  fs::path p = shard_path(index);
  p += ".tmp";
  return p;
}

fs::path ShardWriter::temp_meta_path() const {
  fs::path p = split_meta_path(dir_, prefix_, split_);
  p += ".tmp";
  return p;
}

std::vector<fs::path> ShardWriter::shard_paths() const {
  std::vector<fs::path> paths;
  for (size_t i = 0; i < meta_.shards.size(); ++i) paths.push_back(shard_path(i));
  return paths;
}

uint64_t ShardWriter::room() {
  if (file_ && in_shard_ == max_tokens_) close_shard();
  if (!file_) {
    const fs::path path = temp_path(meta_.shards.size());
    file_.reset(std::fopen(path.c_str(), "wb"));
    BOTTLE_CHECK(file_, "{}: cannot open for writing: {}", path.string(), std::strerror(errno));
    // The count is not known yet: close_shard() writes the header again.
    const auto header = token_shard_header(0, width_);
    BOTTLE_CHECK(std::fwrite(header.data(), sizeof(header), 1, file_.get()) == 1,
                 "{}: write failed: {}", path.string(), std::strerror(errno));
    in_shard_ = 0;
  }
  return max_tokens_ - in_shard_;
}

void ShardWriter::close_shard() {
  const fs::path path = temp_path(meta_.shards.size());
  const auto header = token_shard_header(in_shard_, width_);
  std::FILE* f = file_.get();
  BOTTLE_CHECK(std::fseek(f, 0, SEEK_SET) == 0 &&
                   std::fwrite(header.data(), sizeof(header), 1, f) == 1 && std::fflush(f) == 0,
               "{}: write failed: {}", path.string(), std::strerror(errno));
  BOTTLE_CHECK(::fsync(::fileno(f)) == 0, "{}: fsync failed: {}", path.string(),
               std::strerror(errno));
  BOTTLE_CHECK(std::fclose(file_.release()) == 0, "{}: write failed: {}", path.string(),
               std::strerror(errno));
  meta_.shards.push_back({shard_path(meta_.shards.size()).filename().string(), in_shard_});
  in_shard_ = 0;
}

template <typename Id>
void ShardWriter::write_tokens(std::span<const Id> tokens) {
  staging_.resize(kStagingTokens * size_t(width_));
  for (size_t at = 0; at < tokens.size(); at += kStagingTokens) {
    const size_t n = std::min(kStagingTokens, tokens.size() - at);
    // Host order is the format's little-endian order on every machine bottle runs on (x86-64,
    // aarch64), as for the header.
    if (width_ == 2) {
      for (size_t i = 0; i < n; ++i) {
        const auto t = uint16_t(tokens[at + i]);
        std::memcpy(staging_.data() + 2 * i, &t, 2);
      }
    } else {
      for (size_t i = 0; i < n; ++i) {
        const auto t = uint32_t(tokens[at + i]);
        std::memcpy(staging_.data() + 4 * i, &t, 4);
      }
    }
    BOTTLE_CHECK(std::fwrite(staging_.data(), size_t(width_), n, file_.get()) == n,
                 "{}: write failed: {}", temp_path(meta_.shards.size()).string(),
                 std::strerror(errno));
  }
}

void ShardWriter::append(std::span<const int32_t> tokens, uint64_t bytes) {
  BOTTLE_CHECK(!staged_, "{}_{}: append after stage", prefix_, split_);
  for (int32_t t : tokens)
    BOTTLE_CHECK(t >= 0 && t < meta_.vocab_size,
                 "token {} is outside the vocabulary of {} ids (writing {}_{} shards)", t,
                 meta_.vocab_size, prefix_, split_);
  meta_.tokens += tokens.size();
  while (!tokens.empty()) {
    const size_t n = size_t(std::min<uint64_t>(room(), tokens.size()));
    write_tokens(tokens.first(n));
    in_shard_ += n;
    tokens = tokens.subspan(n);
  }
  ++meta_.documents;
  meta_.bytes += bytes;
}

void ShardWriter::append_bytes(std::string_view text) {
  BOTTLE_CHECK(!staged_, "{}_{}: append after stage", prefix_, split_);
  BOTTLE_CHECK(meta_.vocab_size >= 256, "byte tokens need a vocabulary of 256, not {}",
               meta_.vocab_size);
  std::span<const unsigned char> bytes(reinterpret_cast<const unsigned char*>(text.data()),
                                       text.size());
  meta_.tokens += bytes.size();
  while (!bytes.empty()) {
    const size_t n = size_t(std::min<uint64_t>(room(), bytes.size()));
    write_tokens(bytes.first(n));
    in_shard_ += n;
    bytes = bytes.subspan(n);
  }
  ++meta_.documents;
  meta_.bytes += text.size();
}

const SplitMeta& ShardWriter::stage(std::string tokenizer_kind, std::string tokenizer_description) {
  BOTTLE_CHECK(!staged_, "{}_{}: stage called twice", prefix_, split_);
  staged_ = true;
  if (file_) close_shard();
  meta_.tokenizer_kind = std::move(tokenizer_kind);
  meta_.tokenizer = std::move(tokenizer_description);
  if (!meta_.shards.empty()) write_split_meta(temp_meta_path(), meta_);
  return meta_;
}

void ShardWriter::commit() {
  BOTTLE_CHECK(staged_ && !committed_, "{}_{}: commit without stage, or twice", prefix_, split_);
  auto rename = [](const fs::path& from, const fs::path& to) {
    std::error_code ec;
    fs::rename(from, to, ec);
    BOTTLE_CHECK(!ec, "{}: cannot rename to {}: {}", from.string(), to.string(), ec.message());
  };
  for (size_t i = 0; i < meta_.shards.size(); ++i) rename(temp_path(i), shard_path(i));
  if (!meta_.shards.empty()) {
    meta_path_ = split_meta_path(dir_, prefix_, split_);
    rename(temp_meta_path(), meta_path_);
  }
  committed_ = true;
}

void ShardWriter::remove_stale() {
  BOTTLE_CHECK(committed_, "{}_{}: remove_stale before commit", prefix_, split_);
  // Stale shards beyond this run's last one (an earlier, larger run) would be read along with
  // the new ones by a glob; a .tmp is a crashed run's (this run's are renamed by now).
  const std::string stem = fmt::format("{}_{}_", prefix_, split_);
  const fs::path temp_meta = temp_meta_path().filename();
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir_)) {
    const std::string name = e.path().filename().string();
    const int64_t shard = shard_number(name, stem, ".bin");
    if ((shard >= 0 && uint64_t(shard) >= meta_.shards.size()) ||
        shard_number(name, stem, ".bin.tmp") >= 0 || name == temp_meta)
      stale.push_back(e.path());
  }
  std::sort(stale.begin(), stale.end());
  for (const fs::path& p : stale) {
    std::error_code ec;
    fs::remove(p, ec);
    BOTTLE_CHECK(!ec, "{}: cannot remove stale shard: {}", p.string(), ec.message());
    removed_.push_back(p);
  }
  // An empty split's description would describe shards that are gone.
  if (meta_.shards.empty()) {
    const fs::path meta = split_meta_path(dir_, prefix_, split_);
    std::error_code ec;
    if (fs::remove(meta, ec)) removed_.push_back(meta);
  }
  fsync_path(dir_.string());
}

}  // namespace bottle
