#include "data/shard_meta.h"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/json_io.h"
#include "io/token_shard.h"

namespace bottle {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

uint64_t unsigned_at(const json& object, const char* key, const fs::path& path) {
  const json& v = object.at(key);
  BOTTLE_CHECK(v.is_number_unsigned(), "{}: \"{}\" must be a whole number >= 0, got {}",
               path.string(), key, v.dump());
  return v.get<uint64_t>();
}

std::string string_at(const json& object, const char* key, const fs::path& path) {
  const json& v = object.at(key);
  BOTTLE_CHECK(v.is_string(), "{}: \"{}\" must be a string, got {}", path.string(), key, v.dump());
  return v.get<std::string>();
}

// The meta file of a shard named <prefix>_<split>_NNNNNN.bin: <prefix>_<split>.json beside it;
// nullopt for a shard not named so (it was not written by prepare).
// What precedes _NNNNNN.bin (six or more digits) in a shard's file name, or nullopt.
std::optional<std::string> shard_stem(const std::string& name) {
  constexpr std::string_view kExt = ".bin";
  if (!name.ends_with(kExt)) return std::nullopt;
  size_t digits = name.size() - kExt.size();
  const size_t end = digits;
  while (digits > 0 && name[digits - 1] >= '0' && name[digits - 1] <= '9') --digits;
  if (end - digits < 6 || digits < 2 || name[digits - 1] != '_') return std::nullopt;
  return name.substr(0, digits - 1);
}

std::optional<fs::path> meta_of_shard(const fs::path& shard) {
  const std::optional<std::string> stem = shard_stem(shard.filename().string());
  if (!stem) return std::nullopt;
  return shard.parent_path() / (*stem + ".json");
}

}  // namespace

std::optional<ShardName> parse_shard_name(const std::string& name) {
  const std::optional<std::string> stem = shard_stem(name);
  if (!stem) return std::nullopt;
  const size_t cut = stem->rfind('_');
  if (cut == std::string::npos || cut == 0 || cut + 1 == stem->size()) return std::nullopt;
  return ShardName{stem->substr(0, cut), stem->substr(cut + 1)};
}

fs::path split_meta_path(const fs::path& dir, const std::string& prefix, const std::string& split) {
  return dir / (prefix + "_" + split + ".json");
}

void write_split_meta(const fs::path& path, const SplitMeta& meta) {
  // Keys in the order a reader looks for things (readers take any order).
  using ordered = nlohmann::ordered_json;
  ordered shards = ordered::array();
  for (const ShardEntry& s : meta.shards)
    shards.push_back({{"file", s.file}, {"tokens", s.tokens}});
  const ordered j = {{"split", meta.split},
                     {"documents", meta.documents},
                     {"bytes", meta.bytes},
                     {"tokens", meta.tokens},
                     {"vocab_size", meta.vocab_size},
                     {"tokenizer", meta.tokenizer},
                     {"tokenizer_kind", meta.tokenizer_kind},
                     {"shards", shards}};
  const std::string text = j.dump(2) + "\n";
  std::FILE* out = std::fopen(path.c_str(), "wb");
  BOTTLE_CHECK(out, "{}: cannot open for writing: {}", path.string(), std::strerror(errno));
  const bool written = std::fwrite(text.data(), 1, text.size(), out) == text.size() &&
                       std::fflush(out) == 0 && ::fsync(::fileno(out)) == 0;
  const int err = errno;
  if (std::fclose(out) != 0 || !written) {
    const int cause = written ? errno : err;
    std::error_code ignored;
    fs::remove(path, ignored);
    fail("{}: write failed: {}", path.string(), std::strerror(cause));
  }
}

SplitMeta read_split_meta(const fs::path& path) {
  const json j = read_json_file(path.string());
  SplitMeta m;
  try {
    BOTTLE_CHECK(j.is_object(), "{}: a shard meta file must hold a JSON object", path.string());
    m.split = string_at(j, "split", path);
    m.documents = unsigned_at(j, "documents", path);
    m.bytes = unsigned_at(j, "bytes", path);
    m.tokens = unsigned_at(j, "tokens", path);
    m.vocab_size = int64_t(unsigned_at(j, "vocab_size", path));
    m.tokenizer = string_at(j, "tokenizer", path);
    m.tokenizer_kind = string_at(j, "tokenizer_kind", path);
    const json& shards = j.at("shards");
    BOTTLE_CHECK(shards.is_array(), "{}: \"shards\" must be an array", path.string());
    uint64_t sum = 0;
    for (const json& s : shards) {
      BOTTLE_CHECK(s.is_object(), "{}: each of \"shards\" must be an object", path.string());
      m.shards.push_back({string_at(s, "file", path), unsigned_at(s, "tokens", path)});
      sum += m.shards.back().tokens;
    }
    BOTTLE_CHECK(sum == m.tokens, "{}: its shards hold {} tokens but \"tokens\" says {}",
                 path.string(), sum, m.tokens);
  } catch (const json::exception& e) {
    // The only one out of at(): a missing key.
    fail("{}: malformed shard meta file: {}", path.string(), e.what());
  }
  return m;
}

std::optional<std::pair<fs::path, SplitMeta>> split_meta_of_shard(const std::string& shard_path) {
  const auto meta_path = meta_of_shard(shard_path);
  std::error_code ec;
  if (!meta_path || !fs::exists(*meta_path, ec)) return std::nullopt;
  return std::pair{*meta_path, read_split_meta(*meta_path)};
}

std::optional<double> bytes_per_token(const std::vector<std::string>& shard_paths) {
  std::map<fs::path, SplitMeta> metas;
  for (const std::string& shard : shard_paths) {
    const auto meta_path = meta_of_shard(shard);
    if (!meta_path) return std::nullopt;
    auto it = metas.find(*meta_path);
    if (it == metas.end()) {
      std::error_code ec;
      if (!fs::is_regular_file(*meta_path, ec)) return std::nullopt;
      it = metas.emplace(*meta_path, read_split_meta(*meta_path)).first;
    }
    const std::string name = fs::path(shard).filename().string();
    const uint64_t tokens = token_shard_size(shard);
    bool listed = false;
    for (const ShardEntry& e : it->second.shards) listed |= e.file == name && e.tokens == tokens;
    if (!listed) return std::nullopt;
  }
  uint64_t bytes = 0, tokens = 0;
  for (const auto& [path, meta] : metas) {
    bytes += meta.bytes;
    tokens += meta.tokens;
  }
  if (tokens == 0) return std::nullopt;
  return double(bytes) / double(tokens);
}

}  // namespace bottle
