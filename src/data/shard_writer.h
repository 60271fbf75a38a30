#pragma once
// Streams the tokens of one split (train or val) into llm.c shards, as llm.c's fineweb.py
// lays them out: DIR/<prefix>_<split>_NNNNNN.bin of exactly `max_tokens` tokens each, the last
// one partial, documents crossing shard boundaries. The token width follows the vocabulary
// (uint16 when vocab_size <= 65536, else uint32), so every shard of a data set has one format.
//
// Nothing appears under a shard's real name before commit(), and a run publishes its outputs
// in two phases so that a failure at any point before the renames leaves the previous data set
// as it was, never a mix of old and new files:
//   1. stage(): the last shard is completed; every shard lies fsync'ed under <name>.tmp, the
//      split's description under <prefix>_<split>.json.tmp. Every byte that needs disk space
//      is written here (bottle prepare stages the tokenizer too), so a full disk, a bad JSONL
//      line, a split too small or a kill stops the run before anything of DIR is replaced;
//      the destructor of a writer not committed removes its temporary files (a kill leaves
//      them, for the next run's remove_stale()).
//   2. commit(): renames only (they need no space): the shards and the description take their
//      real names. remove_stale() then removes what an earlier run left that this one does not
//      replace, once every output of the run is committed.
// Memory: one staging buffer, whatever the shard size.
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
  // Removes the temporary files (shards and description) of a split not committed.
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
  // The split's description: complete after stage(), its shards those completed so far.
  const SplitMeta& meta() const { return meta_; }

  // Phase 1: completes the last shard and writes DIR/<prefix>_<split>.json.tmp, both synced
  // to the disk; an empty split writes neither. Errors name the file that could not be
  // written. Call it once; the writer takes no more tokens after it.
  const SplitMeta& stage(std::string tokenizer_kind, std::string tokenizer_description);
  // Phase 2, after stage(): renames every shard and the description into place. Errors name
  // the rename that failed.
  void commit();
  // After commit(), once every output of the run is committed: removes shards of the same
  // prefix and split left by an earlier run with higher numbers (and a killed run's .tmp
  // leftovers), and the description of an earlier run when this split is empty; then syncs
  // DIR, so that the renames and removals survive a power cut.
  void remove_stale();
  // The files remove_stale() removed, and the description written (empty when none).
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
  std::filesystem::path temp_meta_path() const;
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
  bool staged_ = false, committed_ = false;
  std::vector<std::filesystem::path> removed_;
  std::filesystem::path meta_path_;
};

}  // namespace bottle
