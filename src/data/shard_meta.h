#pragma once
// The description `bottle prepare` writes beside the shards of one split,
// DIR/<prefix>_<split>.json:
//   {"split": "train", "documents": D, "bytes": B, "tokens": T, "vocab_size": V,
//    "tokenizer": "<Tokenizer::describe()>", "tokenizer_kind": "bpe",
//    "shards": [{"file": "<prefix>_train_000000.bin", "tokens": n}, ...]}
// `bytes` counts the documents' UTF-8 bytes as the tokenizer saw them (after U+FFFD
// replacement), delimiters excluded; `tokens` counts delimiters included. B / T turns a loss
// per token into bits per byte, which compares models across tokenizers.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace bottle {

struct ShardEntry {
  std::string file;  // the shard's file name, without directory
  uint64_t tokens = 0;
};

struct SplitMeta {
  std::string split;
  uint64_t documents = 0, bytes = 0, tokens = 0;
  int64_t vocab_size = 0;
  std::string tokenizer, tokenizer_kind;
  std::vector<ShardEntry> shards;
};

// DIR/<prefix>_<split>.json.
std::filesystem::path split_meta_path(const std::filesystem::path& dir, const std::string& prefix,
                                      const std::string& split);
// Writes `meta` to `path`, synced to the disk; on failure removes what it wrote of it. `path`
// is a temporary name: ShardWriter renames it into place with the shards (shard_writer.h), so
// that a reader never sees half of it and a full disk is met before anything is replaced.
void write_split_meta(const std::filesystem::path& path, const SplitMeta& meta);
// Reads a meta file; errors name the file and what is malformed in it.
SplitMeta read_split_meta(const std::filesystem::path& path);

// The parts of a shard's file name <prefix>_<split>_NNNNNN.bin (six or more digits), or nullopt
// for any other name.
struct ShardName {
  std::string prefix, split;
};
std::optional<ShardName> parse_shard_name(const std::string& file_name);

// The description of the split a shard belongs to (<prefix>_<split>.json beside
// <prefix>_<split>_NNNNNN.bin) with its path, or nullopt when the shard's name has no such form or
// no such file lies beside it; a description that is not valid is an error naming it.
std::optional<std::pair<std::filesystem::path, SplitMeta>> split_meta_of_shard(
    const std::string& shard_path);

// UTF-8 bytes per token of the data in `shard_paths` (llm.c shards named
// <prefix>_<split>_NNNNNN.bin): total bytes / total tokens of the meta files that describe
// them (each counted once). nullopt when a shard has no meta file beside it, is not listed in
// it, or holds another token count than the meta says (something rewrote it since). A meta
// file that is not valid is an error naming it.
std::optional<double> bytes_per_token(const std::vector<std::string>& shard_paths);

}  // namespace bottle
