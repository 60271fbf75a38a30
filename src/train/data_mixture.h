#pragma once
// DataMixture: the training batches of a run, drawn from one or several sources (data.train's
// patterns), each source a TokenLoader of its own, weighed by data.weights.
//
// Windows, not tokens, are mixed: every micro-batch of every rank is one window of one source
// (B·S + 1 tokens, train/data_loader.h). The windows of the whole job form one stream, as with
// one source; its element g goes to the source whose share lags most behind its weight after
// g elements (Megatron's blended dataset: the largest w_i·(g + 1) − n_i, ties to the first
// source), so after any g elements source i has handed out within one window of w_i·g. The
// weights are fixed to 32-bit fractions and the choice is made in integers: the same order on
// every machine. Each source keeps its own order and epochs (a small source repeats sooner)
// and its own shuffle seed (training.seed + its index).
//
// Data parallelism: rank r of `world` reads stream element r of every round of `world`, as a
// single loader does. Every rank computes the same choices for the round; a rank whose window
// is the k-th of its source in the round reads that source's element k past the source's
// position, and then every source moves by its count in the round. So one source is exactly
// the TokenLoader of data_loader.h: the same windows on every rank, the same position.
//
// The position is one LoaderPosition per source: the elements a source has handed out give
// the counts n_i, and their sum the stream element, so nothing else is saved.
#include <cstdint>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>
#include <vector>

#include "train/data_loader.h"

namespace bottle {

// Where each source stands, in data.train's order. Written as the one source's
// LoaderPosition when there is one (as before mixtures), else as an array of them.
struct DataPosition {
  std::vector<LoaderPosition> sources;
  bool operator==(const DataPosition&) const = default;
};

void to_json(nlohmann::json& j, const DataPosition& p);
// Errors (bottle::Error) name the missing or ill-typed key and the source.
void from_json(const nlohmann::json& j, DataPosition& p);
// "epoch 1, shard 0, window 2"; with several sources "source 1: epoch 1, ...; source 2: ...".
std::string describe_position(const DataPosition& p);

class DataMixture {
 public:
  // `patterns`: a shard file, directory or glob per source; `weights`: one per source (any
  // positive scale), or empty for each source's windows per epoch. Errors name the source.
  DataMixture(const std::vector<std::string>& patterns, const std::vector<double>& weights,
              int64_t batch, int64_t seq, uint64_t seed, int rank, int world);

  // The next micro-batch of this rank: batch·seq inputs and their targets (shifted by one),
  // row-major [batch, seq].
  void next(int32_t* inputs, int32_t* targets);
  // The same into i32 [batch, seq] tensors of `be`, staged through host buffers that keep it
  // (staged_inputs, staged_targets) for the callers' id checks.
  void next(Backend& be, Tensor inputs, Tensor targets);
  std::span<const int32_t> staged_inputs() const { return staged_inputs_; }
  std::span<const int32_t> staged_targets() const { return staged_targets_; }
  // The shard file the last next() read from (for errors about its tokens).
  const std::string& last_file() const { return sources_[last_]->last_file(); }

  DataPosition position() const;
  // Restores a position from position(); errors when it does not fit these sources.
  void set_position(const DataPosition& p);

  size_t source_count() const { return sources_.size(); }
  const TokenLoader& source(size_t i) const { return *sources_[i]; }
  // Every source's shard files, in data.train's order.
  std::vector<std::string> files() const;
  // "2 sources: web/ 75.0 % (9 windows per epoch), code/ 25.0 % (4)": each source's share
  // of the batches.
  std::string describe() const;
  // The epoch of the source furthest on: from 1 on, some data has been read again.
  uint64_t epoch() const;
  // Source i's fixed-point weight and the sum of all of them (choices are in these units).
  uint64_t share(size_t i) const { return shares_[i]; }
  uint64_t total_share() const { return total_share_; }
  // The source of stream element `element`, where counts[i] elements went to source i before
  // it (their sum is `element`).
  size_t choose(uint64_t element, std::span<const uint64_t> counts) const;

 private:
  std::vector<std::unique_ptr<TokenLoader>> sources_;
  std::vector<uint64_t> shares_;  // [sources] weights as fractions of 2^32, each >= 1
  uint64_t total_share_ = 0;
  int rank_, world_;
  size_t last_ = 0;                                      // the source the last next() read
  std::vector<int32_t> staged_inputs_, staged_targets_;  // [batch · seq] each, host staging
};

}  // namespace bottle
