#include "train/shard_record.h"

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "train/data_mixture.h"

namespace bottle {

namespace fs = std::filesystem;

void to_json(nlohmann::json& j, const ShardRecord& s) {
  j = {{"name", s.name}, {"bytes", s.bytes}, {"tokens", s.tokens}};
}

void from_json(const nlohmann::json& j, ShardRecord& s) {
  BOTTLE_CHECK(j.is_object(), "a shard must be an object, got {}", j.type_name());
  auto field = [&](const char* key) -> const nlohmann::json& {
    BOTTLE_CHECK(j.contains(key), "a shard misses key '{}'", key);
    return j[key];
  };
  const nlohmann::json &name = field("name"), &bytes = field("bytes"), &tokens = field("tokens");
  BOTTLE_CHECK(name.is_string(), "a shard's key 'name' must be a string, got {}", name.dump());
  BOTTLE_CHECK(bytes.is_number_unsigned() && tokens.is_number_unsigned(),
               "shard {}: keys 'bytes' and 'tokens' must be non-negative integers",
               name.get<std::string>());
  s = {name.get<std::string>(), bytes.get<uint64_t>(), tokens.get<uint64_t>()};
}

void to_json(nlohmann::json& j, const SourceRecord& s) {
  j = {{"source", s.pattern}, {"shards", s.shards}};
}

void from_json(const nlohmann::json& j, SourceRecord& s) {
  BOTTLE_CHECK(j.is_object() && j.contains("source") && j["source"].is_string() &&
                   j.contains("shards") && j["shards"].is_array(),
               "a source must be an object with a string 'source' and an array 'shards'");
  s.pattern = j["source"].get<std::string>();
  s.shards = j["shards"].get<std::vector<ShardRecord>>();
}

std::string source_base(const std::string& pattern) {
  std::error_code ec;
  if (fs::is_directory(pattern, ec)) return pattern;
  if (pattern.find_first_of("*?[") == std::string::npos)
    return fs::path(pattern).parent_path().string();
  fs::path base;
  for (const fs::path& part : fs::path(pattern).parent_path()) {
    if (part.string().find_first_of("*?[") != std::string::npos) break;
    base /= part;
  }
  return base.string();
}

std::vector<SourceRecord> record_shards(const DataMixture& data) {
  std::vector<SourceRecord> out;
  for (size_t i = 0; i < data.source_count(); ++i) {
    const TokenLoader& source = data.source(i);
    SourceRecord record{source.pattern(), {}};
    const fs::path base = source_base(source.pattern());
    for (size_t f = 0; f < source.files().size(); ++f) {
      const std::string& file = source.files()[f];
      fs::path name = fs::path(file).lexically_relative(base);
      if (name.empty() || name.begin()->string() == "..") name = fs::path(file).filename();
      std::error_code ec;
      const uintmax_t bytes = fs::file_size(file, ec);
      BOTTLE_CHECK(!ec, "{}: cannot read its size: {}", file, ec.message());
      record.shards.push_back({name.generic_string(), uint64_t(bytes), source.tokens_in_file(f)});
    }
    out.push_back(std::move(record));
  }
  return out;
}

namespace {

std::string describe_shard(const ShardRecord& s) {
  return fmt::format("{} ({} bytes, {} tokens)", s.name, s.bytes, s.tokens);
}

// What changed between two lists of one source's shards, or "" when nothing did.
std::string source_changes(const SourceRecord& saved, const SourceRecord& now) {
  std::map<std::string, const ShardRecord*> before, after;
  for (const ShardRecord& s : saved.shards) before[s.name] = &s;
  for (const ShardRecord& s : now.shards) after[s.name] = &s;
  std::vector<std::string> changes;
  for (const auto& [name, s] : after)
    if (!before.count(name)) changes.push_back("added " + describe_shard(*s));
  for (const auto& [name, s] : before)
    if (!after.count(name)) changes.push_back("removed " + describe_shard(*s));
  for (const auto& [name, s] : before)
    if (auto it = after.find(name); it != after.end() && !(*it->second == *s))
      changes.push_back(fmt::format("rewrote {}: {} bytes and {} tokens, now {} and {}", name,
                                    s->bytes, s->tokens, it->second->bytes, it->second->tokens));
  // Equal sets of names with every size the same can still differ in order only if a name
  // repeats; say so rather than nothing.
  if (changes.empty() && saved.shards != now.shards) changes.push_back("another order of shards");
  std::string text;
  for (size_t i = 0; i < changes.size(); ++i) text += (i ? "; " : "") + changes[i];
  return text;
}

}  // namespace

std::string shard_difference(const std::vector<SourceRecord>& saved,
                             const std::vector<SourceRecord>& now) {
  if (saved.size() != now.size())
    return fmt::format("the checkpoint was trained on {} source(s), data.train now names {}",
                       saved.size(), now.size());
  for (size_t i = 0; i < saved.size(); ++i)
    if (const std::string changes = source_changes(saved[i], now[i]); !changes.empty())
      return fmt::format("source {} (\"{}\"{}): {}", i + 1, now[i].pattern,
                         now[i].pattern == saved[i].pattern
                             ? std::string()
                             : fmt::format(", was \"{}\"", saved[i].pattern),
                         changes);
  return "";
}

}  // namespace bottle
