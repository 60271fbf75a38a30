#include "train/data_loader.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "core/error.h"
#include "io/token_shard.h"
#include "train/data_files.h"

namespace bottle {

namespace {

// splitmix64: a tiny, well-mixed generator whose output is fixed by its definition (unlike
// std::shuffle / std::uniform_int_distribution, which differ between standard libraries).
uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t hash3(uint64_t a, uint64_t b, uint64_t c) {
  uint64_t s = a;
  s = splitmix64(s) ^ b;
  s = splitmix64(s) ^ c;
  return splitmix64(s);
}

// Uniform in [0, n), n > 0 (Lemire's multiply-and-reject: exact, no modulo bias).
uint64_t below(uint64_t& state, uint64_t n) {
  unsigned __int128 m = static_cast<unsigned __int128>(splitmix64(state)) * n;
  uint64_t low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(splitmix64(state)) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

// 0..n-1, shuffled by Fisher-Yates from `key` when `shuffle`.
std::vector<uint64_t> permutation(uint64_t n, bool shuffle, uint64_t key) {
  std::vector<uint64_t> p(n);
  std::iota(p.begin(), p.end(), uint64_t{0});
  if (!shuffle) return p;
  uint64_t state = key;
  for (uint64_t i = n; i > 1; --i) std::swap(p[i - 1], p[below(state, i)]);
  return p;
}

constexpr uint64_t kShardOrderTag = 0x5348415244ull;  // "SHARD"

// The token count from a shard's header (read_token_shard's checks) plus "empty".
uint64_t shard_token_count(const std::string& path) {
  const uint64_t count = token_shard_size(path);
  BOTTLE_CHECK(count > 0, "{}: token shard is empty (0 tokens)", path);
  return count;
}

}  // namespace

void to_json(nlohmann::json& j, const LoaderPosition& p) {
  j = nlohmann::json{
      {"epoch", p.epoch}, {"shard_index", p.shard_index}, {"window_index", p.window_index}};
}

void from_json(const nlohmann::json& j, LoaderPosition& p) {
  BOTTLE_CHECK(j.is_object(), "data position: expected a JSON object, got {}", j.dump());
  auto get = [&](const char* key) {
    BOTTLE_CHECK(j.contains(key), "data position: missing key '{}' in {}", key, j.dump());
    const nlohmann::json& v = j.at(key);
    BOTTLE_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
                 "data position: '{}' must be a non-negative integer, got {}", key, v.dump());
    return v.get<uint64_t>();
  };
  p.epoch = get("epoch");
  p.shard_index = get("shard_index");
  p.window_index = get("window_index");
}

TokenLoader::TokenLoader(const std::string& pattern, int64_t batch, int64_t seq, uint64_t seed,
                         int rank, int world, bool shuffle)
    : pattern_(pattern),
      batch_(batch),
      seq_(seq),
      seed_(seed),
      rank_(rank),
      world_(world),
      shuffle_(shuffle) {
  BOTTLE_ASSERT(batch > 0 && seq > 0, "{}: batch ({}) and sequence length ({}) must be positive",
                pattern, batch, seq);
  BOTTLE_ASSERT(world > 0 && rank >= 0 && rank < world,
                "{}: data-parallel rank {} is not in [0, {})", pattern, rank, world);
  files_ = resolve_data_files(pattern);
  const uint64_t per_batch = uint64_t(batch) * uint64_t(seq);
  for (const std::string& file : files_) {
    const uint64_t count = shard_token_count(file);
    BOTTLE_CHECK(count >= per_batch + 1,
                 "{}: token shard has {} tokens, too few for one window of {} x {} + 1 = {} tokens",
                 file, count, batch, seq, per_batch + 1);
    counts_.push_back(count);
    windows_.push_back((count - 1) / per_batch);
    total_windows_ += windows_.back();
  }
}

std::vector<uint64_t> TokenLoader::shard_order(uint64_t epoch) const {
  return permutation(files_.size(), shuffle_, hash3(seed_, epoch, kShardOrderTag));
}

std::vector<uint64_t> TokenLoader::window_order(uint64_t epoch, uint64_t file) const {
  return permutation(windows_.at(file), shuffle_, hash3(seed_, epoch, file));
}

void TokenLoader::use_epoch(uint64_t epoch) const {
  if (order_epoch_ == epoch) return;
  order_ = shard_order(epoch);
  prefix_.assign(order_.size() + 1, 0);
  for (size_t i = 0; i < order_.size(); ++i) prefix_[i + 1] = prefix_[i] + windows_[order_[i]];
  order_epoch_ = epoch;
}

TokenLoader::Slot TokenLoader::locate(uint64_t epoch, uint64_t g) const {
  epoch += g / total_windows_;
  g %= total_windows_;
  use_epoch(epoch);
  // The shard whose range [prefix_[i], prefix_[i+1]) holds g.
  const size_t i =
      size_t(std::upper_bound(prefix_.begin(), prefix_.end(), g) - prefix_.begin()) - 1;
  return Slot{epoch, i, g - prefix_[i]};
}

void TokenLoader::load(uint64_t epoch, uint64_t file) {
  if (loaded_file_ != file) {
    loaded_file_ = UINT64_MAX;
    tokens_ = read_token_shard(files_[file]);
    BOTTLE_CHECK(tokens_.size() == counts_[file],
                 "{}: token shard changed while training ({} tokens, {} before)", files_[file],
                 tokens_.size(), counts_[file]);
    loaded_file_ = file;
    loaded_epoch_ = UINT64_MAX;
  }
  if (loaded_epoch_ != epoch && (shuffle_ || loaded_windows_.size() != windows_[file])) {
    loaded_windows_ = window_order(epoch, file);
  }
  loaded_epoch_ = epoch;
}

void TokenLoader::next(int32_t* inputs, int32_t* targets) {
  read(uint64_t(rank_), inputs, targets);
  advance(uint64_t(world_));
}

void TokenLoader::read(uint64_t ahead, int32_t* inputs, int32_t* targets) {
  const Slot s = locate(epoch_, cursor_ + ahead);
  use_epoch(s.epoch);
  const uint64_t file = order_[s.shard_index];
  load(s.epoch, file);
  const uint64_t per_batch = uint64_t(tokens_per_batch());
  const int32_t* window = tokens_.data() + loaded_windows_[s.window_index] * per_batch;
  std::copy(window, window + per_batch, inputs);
  std::copy(window + 1, window + 1 + per_batch, targets);
}

void TokenLoader::advance(uint64_t elements) {
  cursor_ += elements;
  epoch_ += cursor_ / total_windows_;
  cursor_ %= total_windows_;
}

void TokenLoader::next(Backend& be, Tensor inputs, Tensor targets) {
  BOTTLE_ASSERT(inputs.numel() == tokens_per_batch() && targets.numel() == tokens_per_batch(),
                "{}: a batch of {} x {} tokens does not fill tensors {} and {}", pattern_, batch_,
                seq_, inputs.shape.str(), targets.shape.str());
  staged_inputs_.resize(size_t(tokens_per_batch()));
  staged_targets_.resize(size_t(tokens_per_batch()));
  next(staged_inputs_.data(), staged_targets_.data());
  be.from_host(inputs, staged_inputs_.data());
  be.from_host(targets, staged_targets_.data());
}

LoaderPosition TokenLoader::position() const {
  const Slot s = locate(epoch_, cursor_);
  return LoaderPosition{s.epoch, s.shard_index, s.window_index};
}

void TokenLoader::set_position(const LoaderPosition& p) {
  use_epoch(p.epoch);
  BOTTLE_CHECK(p.shard_index < order_.size() && p.window_index < windows_[order_[p.shard_index]],
               "{}: data position (epoch {}, shard {}, window {}) does not fit these {} shard(s) "
               "({} x {} tokens per batch); were the data or the batch shape changed?",
               pattern_, p.epoch, p.shard_index, p.window_index, order_.size(), batch_, seq_);
  epoch_ = p.epoch;
  cursor_ = prefix_[p.shard_index] + p.window_index;
}

}  // namespace bottle
