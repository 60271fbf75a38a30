// `bottle prepare`: text → llm.c token shards with the byte-level tokenizer (vocabulary 256,
// token = byte value). The inputs are read in order and concatenated (standard input for `-`
// or when no --input is given); the last --val-fraction of the bytes becomes
// DIR/<prefix>_val_NNNNNN.bin, the rest DIR/<prefix>_train_NNNNNN.bin, each split into
// near-equal shards of at most --shard-tokens tokens. Prints the counts and the byte-unigram
// entropy of the train split (nats per token): the loss of the best context-free model, which
// a trained model should beat.
#include <fmt/ranges.h>

#include <climits>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <regex>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "core/error.h"
#include "core/token_shard.h"
#include "train/byte_tokenizer.h"

namespace bottle {

namespace {

namespace fs = std::filesystem;

std::string read_input(const std::string& path) {
  if (path == "-") {
    std::ios::sync_with_stdio(false);
    return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  BOTTLE_CHECK(!fs::is_directory(path), "{}: input is a directory, not a text file", path);
  std::ifstream in(path, std::ios::binary);
  BOTTLE_CHECK(in, "{}: cannot open input file", path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  BOTTLE_CHECK(!in.bad(), "{}: read failed", path);
  return text;
}

// Writes `text` as near-equal shards DIR/<prefix>_<split>_NNNNNN.bin of at most `max_tokens`
// tokens, removes stale shards of the same split with higher numbers (left by an earlier run)
// and returns the number of shards.
size_t write_split(std::string_view text, const std::string& dir, const std::string& prefix,
                   const std::string& split, int64_t max_tokens) {
  const size_t n = text.size();
  const size_t shards = n == 0 ? 0 : (n + size_t(max_tokens) - 1) / size_t(max_tokens);
  for (size_t i = 0, begin = 0; i < shards; ++i) {
    const size_t size = n / shards + (i < n % shards ? 1 : 0);
    const std::string path = fmt::format("{}/{}_{}_{:06d}.bin", dir, prefix, split, i);
    write_token_shard(path, byte_encode(text.substr(begin, size)));
    std::printf("wrote %s (%zu tokens)\n", path.c_str(), size);
    begin += size;
  }
  const std::regex name(prefix + "_" + split + "_([0-9]{6})\\.bin");
  for (const auto& e : fs::directory_iterator(dir)) {
    std::smatch m;
    const std::string file = e.path().filename().string();
    if (std::regex_match(file, m, name) && std::stoul(m[1].str()) >= shards) {
      fs::remove(e.path());
      std::printf("removed stale shard %s\n", e.path().string().c_str());
    }
  }
  return shards;
}

}  // namespace

Command add_prepare_command(CLI::App& app) {
  struct Options {
    std::vector<std::string> inputs;
    std::string output, prefix = "data";
    double val_fraction = 0.05;
    int64_t shard_tokens = 100'000'000;
  };
  auto o = std::make_shared<Options>();
  app.add_option("--input", o->inputs, "text files, concatenated in order ('-' or none: stdin)");
  app.add_option("--output", o->output, "directory for the shards (created if missing)")
      ->required();
  app.add_option("--val-fraction", o->val_fraction,
                 "fraction of the bytes, from the end, for validation (0 <= f < 1)")
      ->check(finite_in(0, 1, /*hi_open=*/true));
  app.add_option("--shard-tokens", o->shard_tokens, "at most this many tokens per shard")
      ->check(integer_in(1, INT32_MAX));
  app.add_option("--prefix", o->prefix, "shard name prefix: <prefix>_train_000000.bin, ...");
  return [o] {
    BOTTLE_CHECK(!o->prefix.empty() && o->prefix.find('/') == std::string::npos &&
                     std::regex_match(o->prefix, std::regex("[A-Za-z0-9._-]+")),
                 "--prefix '{}': use letters, digits, '.', '_' or '-'", o->prefix);
    BOTTLE_CHECK(o->val_fraction >= 0.0 && o->val_fraction < 1.0,
                 "--val-fraction {}: must be at least 0 and below 1", o->val_fraction);
    if (o->inputs.empty()) o->inputs.push_back("-");
    std::string text;
    for (const std::string& input : o->inputs) text += read_input(input);
    const std::string names = fmt::format("{}", fmt::join(o->inputs, ", "));

    const size_t n = text.size();
    const size_t val = size_t(std::floor(double(n) * o->val_fraction));
    const size_t train = n - val;
    // A training window needs at least 2 tokens (an input and its target); so does a
    // validation split when one is asked for.
    BOTTLE_CHECK(train >= 2 && (o->val_fraction == 0.0 || val >= 2),
                 "{}: {} bytes of input are too few to split into train ({} bytes) and validation "
                 "({} bytes, val-fraction {}); each needs at least 2",
                 names, n, train, val, o->val_fraction);

    std::error_code ec;
    fs::create_directories(o->output, ec);
    BOTTLE_CHECK(fs::is_directory(o->output), "{}: cannot create output directory{}", o->output,
                 ec ? ": " + ec.message() : "");
    const std::string_view all(text);
    const size_t train_shards =
        write_split(all.substr(0, train), o->output, o->prefix, "train", o->shard_tokens);
    const size_t val_shards =
        write_split(all.substr(train), o->output, o->prefix, "val", o->shard_tokens);

    const double entropy = byte_unigram_entropy(all.substr(0, train));
    std::printf("input: %zu file(s), %zu bytes\n", o->inputs.size(), n);
    std::printf("train: %zu tokens in %zu shard(s)\n", train, train_shards);
    std::printf("val: %zu tokens in %zu shard(s)\n", val, val_shards);
    std::printf("vocabulary: %d (byte-level: token = byte value)\n", kByteVocabSize);
    std::printf("train byte-unigram entropy: %.6f nats/token (%.4f bits)\n", entropy,
                entropy / std::log(2.0));
    std::string data = fmt::format("[data] train = \"{}/{}_train_*.bin\"", o->output, o->prefix);
    if (val_shards > 0) data += fmt::format(", val = \"{}/{}_val_*.bin\"", o->output, o->prefix);
    std::printf("%s\n", data.c_str());
    return 0;
  };
}

}  // namespace bottle
