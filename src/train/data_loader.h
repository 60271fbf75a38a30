#pragma once
// TokenLoader: batches of B·S tokens (and their shifted targets) from llm.c token shards.
//
// Every shard is cut into windows of B·S + 1 tokens starting at multiples of B·S (llm.c's
// DataLoader: window k is tokens [k·B·S, k·B·S + B·S + 1)); row j of a batch reads
// [j·S, j·S + S) of the window as inputs and the same range shifted by one as targets. An
// epoch visits every window of every shard once. With shuffle on, the order of the shards
// and of the windows inside each shard is a permutation drawn from (seed, epoch) by a
// self-contained PRNG (splitmix64 + Fisher-Yates), the same on every platform; with shuffle
// off the order is llm.c's (files sorted, windows in order).
//
// Data parallelism: the epochs, one after another, form one stream of windows; rank r of
// `world` reads stream elements r, r + world, r + 2·world, ... Each window of an epoch goes
// to exactly one rank. The position (LoaderPosition) is that of the first window of the
// next round of `world` windows, so it is the same on every rank that has called next() the
// same number of times: saving rank 0's position restores every rank.
//
// Shards are loaded lazily, one at a time; their headers are checked when the loader is
// made, so that a missing, empty, truncated, foreign or too small shard is an error naming
// the file before the first batch.
#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace bottle {

// Where the loader stands: `shard_index` indexes the epoch's shard order and
// `window_index` the window order of that shard (both plain indices when unshuffled).
struct LoaderPosition {
  uint64_t epoch = 0, shard_index = 0, window_index = 0;
  bool operator==(const LoaderPosition&) const = default;
};

void to_json(nlohmann::json& j, const LoaderPosition& p);
// Errors (bottle::Error) name the missing or ill-typed key.
void from_json(const nlohmann::json& j, LoaderPosition& p);

class TokenLoader {
 public:
  // `pattern`: a shard file, a directory of *.bin shards or a glob (resolve_data_files).
  TokenLoader(const std::string& pattern, int64_t batch, int64_t seq, uint64_t seed, int rank = 0,
              int world = 1, bool shuffle = true);

  // Fills batch·seq inputs and the targets (the inputs shifted by one token), row-major
  // [batch, seq], then advances by one round of `world` windows.
  void next(int32_t* inputs, int32_t* targets);
  // The same into i32 [batch, seq] tensors of `be`, staged through host buffers, which keep
  // the batch: callers check its ids there (staged_inputs, staged_targets), on the host,
  // rather than on the device, where the check would make the host wait.
  void next(Backend& be, Tensor inputs, Tensor targets);
  std::span<const int32_t> staged_inputs() const { return staged_inputs_; }
  std::span<const int32_t> staged_targets() const { return staged_targets_; }

  // The parts of next(), for a mixture that hands out windows of several loaders
  // (train/data_mixture.h): read() fills a batch from stream element `ahead` past the
  // position, which it leaves; advance() moves the position by `elements`.
  void read(uint64_t ahead, int32_t* inputs, int32_t* targets);
  void advance(uint64_t elements);
  // Stream elements before the position, over all epochs: what one reader has consumed.
  uint64_t consumed() const { return epoch_ * total_windows_ + cursor_; }

  LoaderPosition position() const;
  // Restores a position from position(); errors when it does not fit these shards.
  void set_position(const LoaderPosition& p);

  int64_t batch() const { return batch_; }
  int64_t seq() const { return seq_; }
  int64_t tokens_per_batch() const { return batch_ * seq_; }
  const std::string& pattern() const { return pattern_; }
  const std::vector<std::string>& files() const { return files_; }
  // The shard file the last next() read from (for errors about its tokens).
  const std::string& last_file() const {
    return loaded_file_ < files_.size() ? files_[loaded_file_] : pattern_;
  }
  // Windows in shard file i (files() order) and in a whole epoch (all ranks together).
  uint64_t windows_in_file(size_t i) const { return windows_[i]; }
  // Tokens in shard file i (files() order), from its header.
  uint64_t tokens_in_file(size_t i) const { return counts_[i]; }
  uint64_t windows_per_epoch() const { return total_windows_; }
  uint64_t epoch() const { return epoch_; }

  // The file order and the window order of file `file` in `epoch` (identity when unshuffled).
  std::vector<uint64_t> shard_order(uint64_t epoch) const;
  std::vector<uint64_t> window_order(uint64_t epoch, uint64_t file) const;

 private:
  struct Slot {  // one stream element: a window of a file
    uint64_t epoch, shard_index, window_index;
  };
  std::vector<int32_t> staged_inputs_, staged_targets_;  // [batch · seq] each, host staging
  // Stream element g of `epoch` (g may run past the epoch into the following ones).
  Slot locate(uint64_t epoch, uint64_t g) const;
  void use_epoch(uint64_t epoch) const;  // fills the order caches for `epoch`
  void load(uint64_t epoch, uint64_t file);

  std::string pattern_;
  std::vector<std::string> files_;
  std::vector<uint64_t> counts_;   // tokens per file, from the headers
  std::vector<uint64_t> windows_;  // per file
  uint64_t total_windows_ = 0;
  int64_t batch_, seq_;
  uint64_t seed_;
  int rank_, world_;
  bool shuffle_;

  uint64_t epoch_ = 0, cursor_ = 0;  // the next round starts at stream element cursor_ of epoch_

  // Caches: the shard order of one epoch (with prefix sums of its window counts), and one
  // loaded shard with its window order.
  mutable uint64_t order_epoch_ = UINT64_MAX;
  mutable std::vector<uint64_t> order_, prefix_;
  uint64_t loaded_epoch_ = UINT64_MAX, loaded_file_ = UINT64_MAX;
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> loaded_windows_;
};

}  // namespace bottle
