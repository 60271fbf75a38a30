#pragma once
// Streams the tokens of one split (train or val) into llm.c shards, as llm.c's fineweb.py
// lays them out: DIR/<prefix>_<split>_NNNNNN.bin of exactly `max_tokens` tokens each, the last
// one partial, documents crossing shard boundaries. The token width follows the vocabulary
// (uint16 when vocab_size <= 65536, else uint32), so every shard of a data set has one format.
//
// Nothing appears under a shard's real name before finish(): each shard is written to
// <name>.tmp, fsync'ed, and all of them are renamed into place at the end, so a run that fails
// or crashes half way (a bad JSONL line, a split too small, a kill) leaves the previous data
// set as it was and never a mix of old and new shards. Memory: one staging buffer, whatever
// the shard size.
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "data/shard_meta.h"

namespace bottle {

class ShardWriter {
 public:
  ShardWriter(std::filesystem::path dir, std::string prefix, std::string split, int64_t max_tokens,
              int64_t vocab_size);
  // Removes the temporary files of a split that did not reach finish().
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Appends one document's tokens (its delimiter included); `bytes`: its size in UTF-8 bytes
  // (after U+FFFD replacement), counted in the meta. Errors name a token outside the
  // vocabulary.
  void append(std::span<const int32_t> tokens, uint64_t bytes);
  // Appends one document of the byte-level tokenizer (token = byte value) straight from its
  // bytes: a document as large as a whole text file needs no int32 copy.
  void append_bytes(std::string_view text);

  uint64_t tokens() const { return meta_.tokens; }
  uint64_t documents() const { return meta_.documents; }
  uint64_t bytes() const { return meta_.bytes; }

  // Completes the last shard, renames every shard into place, removes shards of the same
  // prefix and split left by an earlier run with higher numbers (and its .tmp leftovers),
  // then writes DIR/<prefix>_<split>.json. An empty split writes no shard and removes the meta
  // file of an earlier one. Call it once; the writer takes no more tokens after it.
  const SplitMeta& finish(std::string tokenizer_kind, std::string tokenizer_description);
  // Shards removed by finish() as stale, and the meta file written (empty when none).
  const std::vector<std::filesystem::path>& removed() const { return removed_; }
  const std::filesystem::path& meta_path() const { return meta_path_; }
  // The full paths of the shards written, in order.
  std::vector<std::filesystem::path> shard_paths() const;

 private:
  struct FileCloser {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };

  std::filesystem::path shard_path(size_t index) const;
  std::filesystem::path temp_path(size_t index) const;
  // Makes room for more tokens: closes a full shard, opens the next; returns how many tokens
  // the open shard still takes.
  uint64_t room();
  void close_shard();
  // Converts `tokens` to the shard's width and writes them.
  template <typename Id>
  void write_tokens(std::span<const Id> tokens);

  std::filesystem::path dir_;
  std::string prefix_, split_;
  uint64_t max_tokens_;
  int width_;  // bytes per token: 2 or 4
  SplitMeta meta_;
  std::unique_ptr<std::FILE, FileCloser> file_;  // the open shard's .tmp, or null
  uint64_t in_shard_ = 0;                        // tokens in the open shard
  std::vector<char> staging_;                    // tokens converted to the shard's width
  bool finished_ = false;
  std::vector<std::filesystem::path> removed_;
  std::filesystem::path meta_path_;
};

}  // namespace bottle
