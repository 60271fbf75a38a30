// `bottle prepare` end to end: text → byte-level llm.c shards (token = byte), the validation
// split at the end, standard input, the entropy line, and errors naming the input.
#include <cmath>
#include <fstream>
#include <regex>

#include "test_util.h"
#include "train/byte_tokenizer.h"
#include "train/data_loader.h"

namespace bottle::testing {
namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<int32_t> tokens_of(const std::string& text) {
  std::vector<int32_t> t;
  for (unsigned char c : text) t.push_back(c);
  return t;
}

double printed_entropy(const std::string& output) {
  std::smatch m;
  const std::regex line("train byte-unigram entropy: ([0-9.]+) nats");
  EXPECT_TRUE(std::regex_search(output, m, line)) << output;
  return m.empty() ? -1.0 : std::stod(m[1].str());
}

TEST(Prepare, TextToByteShards) {
  TempDir dir;
  std::string a = "Hello, bottle!\n", b;
  for (int i = 0; i < 190; ++i) b += char('a' + (i * 7) % 26);
  b += "\xff\x80\x01";  // bytes above 127 stay single tokens
  write_text(dir / "a.txt", a);
  write_text(dir / "b.txt", b);
  const CommandResult r =
      run(fmt::format("{} prepare --input {} {} --output {} --val-fraction 0.1 --prefix tiny",
                      bottle_binary(), dir / "a.txt", dir / "b.txt", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string all = a + b;  // 208 bytes: 20 (floor of 20.8) for validation
  const size_t val = 20, train = all.size() - val;
  EXPECT_EQ(read_token_shard(dir / "out/tiny_train_000000.bin"), tokens_of(all.substr(0, train)));
  EXPECT_EQ(read_token_shard(dir / "out/tiny_val_000000.bin"), tokens_of(all.substr(train)));
  EXPECT_FALSE(fs::exists(dir / "out/tiny_train_000001.bin"));
  // uint16 llm.c shards: magic 20240520, version 1.
  std::ifstream in(dir / "out/tiny_train_000000.bin", std::ios::binary);
  int32_t header[3];
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], int32_t(train));
  EXPECT_EQ(fs::file_size(dir / "out/tiny_train_000000.bin"), 1024 + 2 * train);
  // The entropy of the train split, in nats.
  double h = 0;
  const auto counts = byte_counts(all.substr(0, train));
  for (uint64_t c : counts)
    if (c) h -= double(c) / double(train) * std::log(double(c) / double(train));
  EXPECT_NEAR(printed_entropy(r.output), h, 1e-5) << r.output;
  EXPECT_NEAR(unigram_entropy(counts), h, 1e-12);
  EXPECT_NE(r.output.find(fmt::format("train: {} tokens in 1 shard(s)", train)), std::string::npos)
      << r.output;
  // The shards feed the loader; decoding gives the text back.
  TokenLoader loader(dir / "out/tiny_train_*.bin", 1, 16, 0, 0, 1, false);
  std::vector<int32_t> in16(16), out16(16);
  loader.next(in16.data(), out16.data());
  EXPECT_EQ(byte_decode(in16), all.substr(0, 16));
}

TEST(Prepare, SplitsIntoShardsAndRemovesStaleOnes) {
  TempDir dir;
  std::string text;
  for (int i = 0; i < 1000; ++i) text += char(32 + i % 90);
  write_text(dir / "t.txt", text);
  // An earlier run's extra shard must not be picked up by the glob.
  fs::create_directories(dir / "out");
  write_token_shard(dir / "out/data_train_000009.bin", {1, 2, 3});
  const CommandResult r = run(fmt::format("{} prepare --input {} --output {} --shard-tokens 300",
                                          bottle_binary(), dir / "t.txt", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  // 950 train bytes in ceil(950 / 300) = 4 near-equal shards; 50 validation bytes.
  std::vector<int32_t> joined;
  for (int i = 0; i < 4; ++i) {
    const auto t = read_token_shard(dir / fmt::format("out/data_train_{:06d}.bin", i));
    EXPECT_LE(t.size(), 300u);
    EXPECT_GE(t.size(), 237u);
    joined.insert(joined.end(), t.begin(), t.end());
  }
  EXPECT_EQ(joined, tokens_of(text.substr(0, 950)));
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"), tokens_of(text.substr(950)));
  EXPECT_FALSE(fs::exists(dir / "out/data_train_000004.bin"));
  EXPECT_FALSE(fs::exists(dir / "out/data_train_000009.bin"));
}

TEST(Prepare, ReadsStandardInput) {
  TempDir dir;
  const std::string text =
      "the quick brown fox jumps over the lazy dog, twice: the quick brown fox";
  write_text(dir / "in.txt", text);
  for (const std::string input : {"", "--input -"}) {
    const CommandResult r = run(fmt::format("{} prepare {} --output {} --val-fraction 0 < {}",
                                            bottle_binary(), input, dir / "out", dir / "in.txt"));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(read_token_shard(dir / "out/data_train_000000.bin"), tokens_of(text));
    EXPECT_FALSE(fs::exists(dir / "out/data_val_000000.bin"));
    EXPECT_NEAR(printed_entropy(r.output), byte_unigram_entropy(text), 1e-5);
  }
}

TEST(Prepare, MissingInputIsAnErrorNamingIt) {
  TempDir dir;
  write_text(dir / "ok.txt", "plenty of text here to split");
  const CommandResult r = run(fmt::format("{} prepare --input {} {} --output {}", bottle_binary(),
                                          dir / "ok.txt", dir / "missing.txt", dir / "out"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("bottle: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir / "missing.txt"), std::string::npos) << r.output;
}

TEST(Prepare, InputTooSmallToSplitIsAnError) {
  TempDir dir;
  write_text(dir / "small.txt", "abc");
  const CommandResult r = run(fmt::format("{} prepare --input {} --output {}", bottle_binary(),
                                          dir / "small.txt", dir / "out"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("too few"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir / "small.txt"), std::string::npos) << r.output;
}

TEST(ByteTokenizer, RoundTripsEveryByte) {
  std::string all;
  for (int c = 0; c < 256; ++c) all += char(c);
  const auto t = byte_encode(all);
  for (int c = 0; c < 256; ++c) EXPECT_EQ(t[size_t(c)], c);
  EXPECT_EQ(byte_decode(t), all);
  EXPECT_THROW(byte_decode(256), Error);
  EXPECT_NEAR(byte_unigram_entropy(all), std::log(256.0), 1e-12);
  EXPECT_EQ(byte_unigram_entropy("aaaa"), 0.0);
}

}  // namespace
}  // namespace bottle::testing
