#include "train/data_mixture.h"

#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"

namespace bottle {

namespace fs = std::filesystem;

void to_json(nlohmann::json& j, const DataPosition& p) {
  if (p.sources.size() == 1) {
    j = p.sources.front();
    return;
  }
  j = nlohmann::json::array();
  for (const LoaderPosition& s : p.sources) j.push_back(s);
}

void from_json(const nlohmann::json& j, DataPosition& p) {
  p.sources.clear();
  if (!j.is_array()) {
    p.sources.push_back(j.get<LoaderPosition>());
    return;
  }
  BOTTLE_CHECK(!j.empty(), "data position: an empty array names no source");
  for (size_t i = 0; i < j.size(); ++i) {
    try {
      p.sources.push_back(j[i].get<LoaderPosition>());
    } catch (const Error& e) {
      fail("source {}: {}", i + 1, e.what());
    }
  }
}

std::string describe_position(const DataPosition& p) {
  std::string out;
  for (size_t i = 0; i < p.sources.size(); ++i) {
    const LoaderPosition& s = p.sources[i];
    const std::string one =
        fmt::format("epoch {}, shard {}, window {}", s.epoch, s.shard_index, s.window_index);
    out += p.sources.size() == 1 ? one : fmt::format("{}source {}: {}", i ? "; " : "", i + 1, one);
  }
  return out;
}

DataMixture::DataMixture(const std::vector<std::string>& patterns,
                         const std::vector<double>& weights, int64_t batch, int64_t seq,
                         uint64_t seed, int rank, int world)
    : rank_(rank), world_(world) {
  BOTTLE_ASSERT(!patterns.empty(), "a data mixture needs a source");
  BOTTLE_ASSERT(weights.empty() || weights.size() == patterns.size(),
                "{} weight(s) for {} data source(s)", weights.size(), patterns.size());
  BOTTLE_ASSERT(world > 0 && rank >= 0 && rank < world, "data-parallel rank {} is not in [0, {})",
                rank, world);
  for (size_t i = 0; i < patterns.size(); ++i) {
    // One source reads as before mixtures: its errors need no source number.
    try {
      sources_.push_back(std::make_unique<TokenLoader>(patterns[i], batch, seq, seed + i));
    } catch (const Error& e) {
      if (patterns.size() == 1) throw;
      fail("source {} of {} (\"{}\"): {}", i + 1, patterns.size(), patterns[i], e.what());
    }
  }
  // Two spellings of one data set (a directory and a glob, a path and a symbolic link) would
  // weigh its shards twice: each shard belongs to one source.
  std::map<fs::path, size_t> owner;
  for (size_t i = 0; i < sources_.size(); ++i)
    for (const std::string& file : sources_[i]->files()) {
      std::error_code ec;
      const auto [at, fresh] = owner.emplace(fs::weakly_canonical(file, ec), i);
      BOTTLE_CHECK(fresh || at->second == i,
                   "sources {} (\"{}\") and {} (\"{}\") both hold the shard {}; "
                   "name each shard in one source only (give a source more weight in data.weights "
                   "instead)",
                   at->second + 1, patterns[at->second], i + 1, patterns[i], file);
    }
  // Weights as fractions of 2^32, rounded, at least 1: exact integers for the choices.
  std::vector<double> w = weights;
  if (w.empty())
    for (const auto& s : sources_) w.push_back(double(s->windows_per_epoch()));
  double sum = 0.0;
  for (const double x : w) {
    BOTTLE_ASSERT(std::isfinite(x) && x > 0, "data weight {} is not a positive number", x);
    sum += x;
  }
  for (const double x : w) {
    shares_.push_back(std::max<uint64_t>(1, uint64_t(std::llround(x / sum * 4294967296.0))));
    total_share_ += shares_.back();
  }
}

size_t DataMixture::choose(uint64_t element, std::span<const uint64_t> counts) const {
  // The source furthest behind its share after element + 1 elements: largest
  // share_i·(element + 1) − counts_i·total. 128 bits hold both products (< 2^96).
  size_t best = 0;
  __int128 best_lag = 0;
  for (size_t i = 0; i < shares_.size(); ++i) {
    const __int128 lag = __int128(shares_[i]) * (__int128(element) + 1) -
                         __int128(counts[i]) * __int128(total_share_);
    if (i == 0 || lag > best_lag) best = i, best_lag = lag;
  }
  return best;
}

void DataMixture::next(int32_t* inputs, int32_t* targets) {
  // This round's choices, the same on every rank; `mine` is this rank's element.
  std::vector<uint64_t> counts(sources_.size()), in_round(sources_.size());
  uint64_t element = 0;
  for (size_t i = 0; i < sources_.size(); ++i) {
    counts[i] = sources_[i]->consumed();
    element += counts[i];
  }
  size_t mine = 0;
  uint64_t ahead = 0;
  for (int k = 0; k < world_; ++k) {
    const size_t s = choose(element + uint64_t(k), counts);
    if (k == rank_) mine = s, ahead = in_round[s];
    ++counts[s];
    ++in_round[s];
  }
  sources_[mine]->read(ahead, inputs, targets);
  last_ = mine;
  for (size_t i = 0; i < sources_.size(); ++i) sources_[i]->advance(in_round[i]);
}

void DataMixture::next(Backend& be, Tensor inputs, Tensor targets) {
  const TokenLoader& first = *sources_.front();
  BOTTLE_ASSERT(
      inputs.numel() == first.tokens_per_batch() && targets.numel() == first.tokens_per_batch(),
      "a batch of {} x {} tokens does not fill tensors {} and {}", first.batch(), first.seq(),
      inputs.shape.str(), targets.shape.str());
  staged_inputs_.resize(size_t(first.tokens_per_batch()));
  staged_targets_.resize(size_t(first.tokens_per_batch()));
  next(staged_inputs_.data(), staged_targets_.data());
  be.from_host(inputs, staged_inputs_.data());
  be.from_host(targets, staged_targets_.data());
}

DataPosition DataMixture::position() const {
  DataPosition p;
  for (const auto& s : sources_) p.sources.push_back(s->position());
  return p;
}

void DataMixture::set_position(const DataPosition& p) {
  BOTTLE_CHECK(p.sources.size() == sources_.size(),
               "the data position holds {} source(s), but data.train has {}; were the data "
               "sources changed?",
               p.sources.size(), sources_.size());
  for (size_t i = 0; i < sources_.size(); ++i) sources_[i]->set_position(p.sources[i]);
}

std::vector<std::string> DataMixture::files() const {
  std::vector<std::string> out;
  for (const auto& s : sources_) out.insert(out.end(), s->files().begin(), s->files().end());
  return out;
}

std::string DataMixture::describe() const {
  std::string out = fmt::format("{} sources: ", sources_.size());
  for (size_t i = 0; i < sources_.size(); ++i)
    out += fmt::format("{}{} {:.1f} % ({}{})", i ? ", " : "", sources_[i]->pattern(),
                       100.0 * double(shares_[i]) / double(total_share_),
                       sources_[i]->windows_per_epoch(), i ? "" : " windows per epoch");
  return out;
}

uint64_t DataMixture::epoch() const {
  uint64_t e = 0;
  for (const auto& s : sources_) e = std::max(e, s->epoch());
  return e;
}

}  // namespace bottle
