// DataMixture (train/data_mixture.h): one source is exactly the TokenLoader it wraps; several
// hand out windows in the shares of their weights at every prefix of the stream, in an order
// fixed by integers; data-parallel ranks split each round's windows; a saved position (and its
// JSON) restarts the stream exactly; errors name the source.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "io/token_shard.h"
#include "test_util.h"
#include "train/data_mixture.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;

using bottle::testing::TempDir;

constexpr int64_t B = 2, S = 4, BS = B * S;

struct Batch {
  std::vector<int32_t> inputs, targets;
  bool operator==(const Batch&) const = default;
};

template <typename Loader>
Batch next(Loader& loader) {
  Batch b;
  b.inputs.resize(size_t(BS));
  b.targets.resize(b.inputs.size());
  loader.next(b.inputs.data(), b.targets.data());
  return b;
}

template <typename Loader>
std::vector<Batch> take(Loader& loader, int n) {
  std::vector<Batch> out;
  for (int i = 0; i < n; ++i) out.push_back(next(loader));
  return out;
}

// Three sources, each a directory of two shards, with 9, 4 and 13 windows of 2 x 4 tokens in
// all. Source s's tokens are 10000·(s+1) + i: a batch's first token names its source.
class Sources : public ::testing::Test {
 protected:
  void SetUp() override {
    const int64_t windows[3][2] = {{5, 4}, {1, 3}, {6, 7}};
    for (int s = 0; s < 3; ++s) {
      const fs::path d = dir / fmt::format("source{}", s);
      fs::create_directories(d);
      patterns.push_back(d.string());
      int32_t next_token = 10000 * (s + 1);
      for (int f = 0; f < 2; ++f) {
        std::vector<int32_t> t(size_t(windows[s][f] * BS + 1 + f));
        for (int32_t& v : t) v = next_token++;
        write_token_shard(d / fmt::format("shard_{}.bin", f), t);
      }
    }
  }
  static int source_of(const Batch& b) { return b.inputs[0] / 10000 - 1; }
  DataMixture mixture(std::vector<double> weights, int rank = 0, int world = 1, size_t n = 3) {
    return DataMixture({patterns.begin(), patterns.begin() + ptrdiff_t(n)}, weights, B, S, 11, rank,
                       world);
  }
  TempDir dir;
  std::vector<std::string> patterns;
};

TEST_F(Sources, OneSourceIsItsTokenLoader) {
  // For every world size and rank: the same batches and positions as the loader that reads
  // every world-th window itself, over several epochs (13 windows).
  for (int world : {1, 2, 3}) {
    for (int rank = 0; rank < world; ++rank) {
      DataMixture m({patterns[2]}, {}, B, S, 11, rank, world);
      TokenLoader l(patterns[2], B, S, 11, rank, world);
      for (int i = 0; i < 40; ++i) {
        ASSERT_EQ(next(m), next(l)) << "world " << world << ", rank " << rank << ", batch " << i;
        ASSERT_EQ(m.position(), DataPosition{{l.position()}});
        ASSERT_EQ(m.epoch(), l.epoch());
      }
    }
  }
}

TEST_F(Sources, SharesFollowTheWeightsAtEveryPrefix) {
  for (const std::vector<double>& weights :
       {std::vector<double>{3, 1, 1}, {0.2, 0.5, 0.3}, {1, 1, 1}, {1000, 1, 10}}) {
    DataMixture m = mixture(weights);
    double sum = 0;
    for (double w : weights) sum += w;
    std::vector<int64_t> counts(3);
    for (int g = 1; g <= 500; ++g) {
      ++counts[size_t(source_of(next(m)))];
      // Within one window of its share (the error-driven choice never lets a source lag or
      // lead by a whole window).
      for (size_t i = 0; i < 3; ++i)
        ASSERT_LT(std::abs(double(counts[i]) - weights[i] / sum * g), 1.0 + 1e-6)
            << "source " << i << " after " << g << " windows, weights " << weights[0] << ", "
            << weights[1] << ", " << weights[2];
    }
  }
}

TEST_F(Sources, TheOrderIsFixedByTheWeights) {
  // 3 : 1 hands out 0, 0, 1, 0 again and again (ties go to the first source).
  DataMixture m = mixture({3, 1}, 0, 1, 2);
  std::vector<int> order;
  for (int i = 0; i < 12; ++i) order.push_back(source_of(next(m)));
  EXPECT_EQ(order, (std::vector<int>{0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0}));
}

TEST_F(Sources, WithoutWeightsEachSourceWeighsItsSize) {
  // 9, 4 and 13 windows: one epoch of the mixture is one epoch of every source.
  DataMixture m = mixture({});
  std::map<int, std::set<int32_t>> seen;
  for (int i = 0; i < 26; ++i) {
    const Batch b = next(m);
    EXPECT_TRUE(seen[source_of(b)].insert(b.inputs[0]).second) << "a window read twice";
  }
  EXPECT_EQ(seen[0].size(), 9u);
  EXPECT_EQ(seen[1].size(), 4u);
  EXPECT_EQ(seen[2].size(), 13u);
  EXPECT_EQ(m.epoch(), 1u);
}

TEST_F(Sources, EachSourceRepeatsByItself) {
  // Source 1 (4 windows) at half the batches runs through epochs while the others do not.
  DataMixture m = mixture({1, 2, 1});
  take(m, 40);
  const DataPosition p = m.position();
  EXPECT_EQ(p.sources[1].epoch, 5u);  // 20 windows of 4
  EXPECT_EQ(p.sources[0].epoch, 1u);  // 10 of 9
  EXPECT_EQ(p.sources[2].epoch, 0u);  // 10 of 13
  EXPECT_EQ(m.epoch(), 5u);
}

TEST_F(Sources, RanksSplitEachRoundOfTheOneProcessStream) {
  for (int world : {2, 3, 4}) {
    std::vector<DataMixture> ranks;
    for (int r = 0; r < world; ++r) ranks.push_back(mixture({2, 1, 3}, r, world));
    DataMixture single = mixture({2, 1, 3});
    std::vector<Batch> interleaved;
    for (int round = 0; round < 30; ++round)
      for (int r = 0; r < world; ++r) interleaved.push_back(next(ranks[size_t(r)]));
    EXPECT_EQ(interleaved, take(single, 30 * world)) << "world " << world;
    for (int r = 1; r < world; ++r) EXPECT_EQ(ranks[size_t(r)].position(), ranks[0].position());
    EXPECT_EQ(ranks[0].position(), single.position());
  }
}

TEST_F(Sources, ASavedPositionRestartsTheStream) {
  DataMixture a = mixture({2, 1, 3}, 1, 2);
  take(a, 17);
  // Through the JSON of trainer_state.json, into another mixture of the same sources.
  const std::string text = nlohmann::json(a.position()).dump();
  EXPECT_EQ(text.front(), '[') << text;
  DataMixture b = mixture({2, 1, 3}, 1, 2);
  b.set_position(nlohmann::json::parse(text).get<DataPosition>());
  EXPECT_EQ(take(b, 25), take(a, 25));
}

TEST(DataPosition, OneSourceIsWrittenAsBeforeMixtures) {
  const DataPosition one{{{1, 0, 2}}};
  EXPECT_EQ(nlohmann::json(one).dump(), R"({"epoch":1,"shard_index":0,"window_index":2})");
  EXPECT_EQ(
      nlohmann::json::parse(R"({"epoch":1,"shard_index":0,"window_index":2})").get<DataPosition>(),
      one);
  const DataPosition two{{{1, 0, 2}, {0, 3, 4}}};
  EXPECT_EQ(nlohmann::json(two).get<DataPosition>(), two);
  EXPECT_EQ(describe_position(one), "epoch 1, shard 0, window 2");
  EXPECT_EQ(describe_position(two),
            "source 1: epoch 1, shard 0, window 2; source 2: epoch 0, shard 3, window 4");
  EXPECT_THROW(nlohmann::json::array().get<DataPosition>(), Error);
  try {
    nlohmann::json::parse(R"([{"epoch":1,"shard_index":0,"window_index":2}, {"epoch":1}])")
        .get<DataPosition>();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("source 2: data position: missing key 'shard_index'"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(Sources, APositionOfOtherSourcesIsAnError) {
  DataMixture m = mixture({1, 1, 1});
  try {
    m.set_position(DataPosition{{{0, 0, 0}, {0, 0, 0}}});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds 2 source(s), but data.train has 3"),
              std::string::npos)
        << e.what();
  }
  // Source 2 has 2 shards.
  EXPECT_THROW(m.set_position(DataPosition{{{0, 0, 0}, {0, 2, 0}, {0, 0, 0}}}), Error);
}

// Issue 45, case 7: one data set spelt twice (its directory and a glob of its shards) would be
// two sources weighing the same shards; refused, naming both and the shard (was accepted).
TEST_F(Sources, TheSameShardsInTwoSourcesAreRefused) {
  const std::string glob = patterns[0] + "/shard_*.bin";
  const std::string what = testing::error_of([&] {
    DataMixture({patterns[0], patterns[1], glob}, {}, B, S, 1, 0, 1);
  });
  EXPECT_NE(what.find(fmt::format("sources 1 (\"{}\") and 3 (\"{}\") both hold the shard {}",
                                  patterns[0], glob, patterns[0] + "/shard_0.bin")),
            std::string::npos)
      << what;
}

TEST_F(Sources, ASourceThatDoesNotOpenIsNamed) {
  try {
    DataMixture({patterns[0], dir / "missing"}, {}, B, S, 1, 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("source 2 of 2 (\"" + (dir / "missing") + "\")"), std::string::npos)
        << what;
  }
  // One source reads as it always did: no source number.
  try {
    DataMixture({dir / "missing"}, {}, B, S, 1, 0, 1);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("source 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bottle
