#pragma once
// The shards a checkpoint was trained on, per data.train source: each shard's name relative to
// its source (so a data set moved elsewhere keeps its names), its size in bytes and its token
// count. A saved data position indexes windows of exactly these shards in a shuffled order, so
// --resume compares the record with what data.train resolves to now and refuses a difference
// (a shard added, removed or rewritten), naming the source and the shard; the same shards
// under another path are the same data.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace bottle {

class DataMixture;

struct ShardRecord {
  std::string name;     // relative to the source's base (source_base)
  uint64_t bytes = 0;   // the file's size
  uint64_t tokens = 0;  // from its header
  bool operator==(const ShardRecord&) const = default;
};

struct SourceRecord {
  std::string pattern;              // data.train's entry as the run spelled it (for messages)
  std::vector<ShardRecord> shards;  // in the loader's (sorted) order
  bool operator==(const SourceRecord& o) const { return shards == o.shards; }
};

void to_json(nlohmann::json& j, const ShardRecord& s);
void from_json(const nlohmann::json& j, ShardRecord& s);
void to_json(nlohmann::json& j, const SourceRecord& s);
void from_json(const nlohmann::json& j, SourceRecord& s);

// The directory a source's shard names are relative to: the directory itself, a file's parent,
// or a glob's leading components without a wildcard.
std::string source_base(const std::string& pattern);

// The record of every source of `data`, in data.train's order (sizes read from the files now).
std::vector<SourceRecord> record_shards(const DataMixture& data);

// "" when `now` holds the same shards as `saved`, source by source; else one sentence naming the
// first source that differs and what changed (the shards added, removed, or rewritten with
// their sizes and token counts before and after).
std::string shard_difference(const std::vector<SourceRecord>& saved,
                             const std::vector<SourceRecord>& now);

}  // namespace bottle
