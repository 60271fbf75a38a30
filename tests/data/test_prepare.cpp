// `bottle prepare` end to end: documents → llm.c shards. Byte-level shards (token = byte),
// validation by documents (document i is for validation iff floor((i+1)·f) > floor(i·f); a
// text file is one document, a JSONL line one), fixed-size shards, standard input, JSONL and
// gzip inputs, the entropy line, the meta files and bytes per token, identical shards for any
// thread count, a tiktoken tokenizer travelling with the data, and errors naming the input.
// The ShardWriter and the meta reader directly: token width by vocabulary, shard boundaries,
// nothing under a real name before commit().
#include <cmath>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "data/byte_tokenizer.h"
#include "data/shard_meta.h"
#include "data/shard_writer.h"
#include "data/tokenizer.h"
#include "test_util.h"
#include "train/data_loader.h"

namespace bottle::testing {
namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
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

int32_t header_word(const std::string& path, int i) {
  std::ifstream in(path, std::ios::binary);
  int32_t header[3] = {};
  in.read(reinterpret_cast<char*>(header), sizeof(header));
  return header[i];
}

// Every file of `dir` with its bytes, for comparing whole outputs.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_regular_file()) files[e.path().filename().string()] = read_bytes(e.path().string());
  return files;
}

std::string jsonl_line(const std::string& text) {
  return nlohmann::json{{"text", text}}.dump() + "\n";
}

// A small tiktoken rank file: every byte, then a few English merges (ranks 256...), so that
// tokens are not bytes and the default <|endoftext|> delimiter lands after them.
std::string write_tiktoken(const TempDir& dir) {
  const std::string path = dir / "tiny.tiktoken";
  std::ofstream out(path, std::ios::binary);
  int rank = 0;
  for (int b = 0; b < 256; ++b) out << base64(std::string(1, char(b))) << " " << rank++ << "\n";
  for (const char* merge : {"th", "he", "in", "er", "an", " t", " th", "the", " the", "ing", " a",
                            "on", "re", "at", "en", "nd", " and"})
    out << base64(merge) << " " << rank++ << "\n";
  return path;
}

std::string sentences(int seed, int count) {
  return sentences_of({"the",   "quick", "brown", "fox",   "jumps",
                       "over",  "lazy",  "dog",   "and",   "then",
                       "rests", "in",    "shade", "there", "under",
                       "green", "trees", "near",  "river", "\xc3\xa9t\xc3\xa9"},
                      seed, count);
}

TEST(Prepare, TextToByteShards) {
  TempDir dir;
  std::string a = "Hello, bottle!\n", b, c = "validation text\n";
  for (int i = 0; i < 190; ++i) b += char('a' + (i * 7) % 26);
  b += "\xff\x80\x01";  // bytes above 127 stay single tokens, invalid UTF-8 untouched
  write_text(dir / "a.txt", a);
  write_text(dir / "b.txt", b);
  write_text(dir / "c.txt", c);
  // Three documents at f = 0.34: floor(3·0.34) = 1 validation document, the third.
  const CommandResult r = run(fmt::format(
      "{} prepare --input {} {} {} --output {} --val-fraction 0.34 --prefix tiny --no-progress",
      bottle_binary(), dir / "a.txt", dir / "b.txt", dir / "c.txt", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string train = a + b;
  EXPECT_EQ(read_token_shard(dir / "out/tiny_train_000000.bin"), tokens_of(train));
  EXPECT_EQ(read_token_shard(dir / "out/tiny_val_000000.bin"), tokens_of(c));
  EXPECT_FALSE(fs::exists(dir / "out/tiny_train_000001.bin"));
  EXPECT_FALSE(fs::exists(dir / "out/tokenizer"));
  // uint16 llm.c shards: magic 20240520, version 1.
  EXPECT_EQ(header_word(dir / "out/tiny_train_000000.bin", 0), 20240520);
  EXPECT_EQ(header_word(dir / "out/tiny_train_000000.bin", 1), 1);
  EXPECT_EQ(header_word(dir / "out/tiny_train_000000.bin", 2), int32_t(train.size()));
  EXPECT_EQ(fs::file_size(dir / "out/tiny_train_000000.bin"), 1024 + 2 * train.size());
  // The entropy of the train split, in nats.
  double h = 0;
  const auto counts = byte_counts(train);
  for (uint64_t n : counts)
    if (n) h -= double(n) / double(train.size()) * std::log(double(n) / double(train.size()));
  EXPECT_NEAR(printed_entropy(r.output), h, 1e-5) << r.output;
  EXPECT_NEAR(unigram_entropy(counts), h, 1e-12);
  EXPECT_NE(r.output.find(fmt::format("train: {} tokens in 1 shard(s)", train.size())),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("3 document(s) (train 2, val 1)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(fmt::format("[data] train = \"{}/tiny_train_*.bin\", val = "
                                      "\"{}/tiny_val_*.bin\"",
                                      dir / "out", dir / "out")),
            std::string::npos)
      << r.output;
  // The shards feed the loader; decoding gives the text back.
  TokenLoader loader(dir / "out/tiny_train_*.bin", 1, 16, 0, 0, 1, false);
  std::vector<int32_t> in16(16), out16(16);
  loader.next(in16.data(), out16.data());
  EXPECT_EQ(byte_decode(in16), train.substr(0, 16));
}

TEST(Prepare, FixedSizeShardsAndStaleOnesRemoved) {
  TempDir dir;
  // 20 documents of 50 bytes: at f = 0.05 the 20th is the validation split.
  std::string all;
  for (int d = 0; d < 20; ++d) {
    std::string text;
    for (int i = 0; i < 50; ++i) text += char(32 + (d * 50 + i) % 90);
    fs::create_directories(dir / "in");
    write_text(dir / fmt::format("in/doc{:02d}.txt", d), text);
    all += text;
  }
  // An earlier run's extra shards, its meta, a crashed run's .tmp and another prefix's shard.
  fs::create_directories(dir / "out");
  write_token_shard(dir / "out/data_train_000009.bin", {1, 2, 3});
  write_token_shard(dir / "out/data_val_000003.bin", {1, 2, 3});
  write_token_shard(dir / "out/data_train_000011.bin.tmp", {1, 2, 3});
  write_token_shard(dir / "out/other_train_000009.bin", {1, 2, 3});
  const CommandResult r = run(fmt::format("{} prepare --input {} --output {} --shard-tokens 300",
                                          bottle_binary(), dir / "in", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  // 950 train bytes in shards of exactly 300 (documents cross boundaries), the last partial.
  std::vector<int32_t> joined;
  for (int i = 0; i < 4; ++i) {
    const auto t = read_token_shard(dir / fmt::format("out/data_train_{:06d}.bin", i));
    EXPECT_EQ(t.size(), i < 3 ? 300u : 50u) << i;
    joined.insert(joined.end(), t.begin(), t.end());
  }
  EXPECT_EQ(joined, tokens_of(all.substr(0, 950)));
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"), tokens_of(all.substr(950)));
  EXPECT_FALSE(fs::exists(dir / "out/data_train_000004.bin"));
  EXPECT_FALSE(fs::exists(dir / "out/data_train_000009.bin"));
  EXPECT_FALSE(fs::exists(dir / "out/data_val_000003.bin"));
  EXPECT_FALSE(fs::exists(dir / "out/data_train_000011.bin.tmp"));
  EXPECT_TRUE(fs::exists(dir / "out/other_train_000009.bin"));
  EXPECT_NE(r.output.find("removed stale"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train: 950 tokens in 4 shard(s)"), std::string::npos) << r.output;
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
    EXPECT_FALSE(fs::exists(dir / "out/data_val.json"));
    EXPECT_EQ(r.output.find("val = "), std::string::npos) << r.output;
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
  // One document cannot give a validation split at 0.05: the message says how many can.
  CommandResult r = run(fmt::format("{} prepare --input {} --output {}", bottle_binary(),
                                    dir / "small.txt", dir / "out"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("too few"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir / "small.txt"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("1 document(s)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("it takes 20"), std::string::npos) << r.output;
  // A train split of one token has no target to predict.
  write_text(dir / "one.txt", "x");
  r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0", bottle_binary(),
                      dir / "one.txt", dir / "out"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("too few tokens"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("train has 1 token(s) in 1 document(s)"), std::string::npos) << r.output;
  // Nothing was written under a shard's name.
  EXPECT_TRUE(!fs::exists(dir / "out") || fs::is_empty(dir / "out"));
}

// nanoGPT's habit: one input.txt, prepared with defaults. Its paragraphs are the documents
// (every 20th for validation at 0.05), and a text too short to split says what to do and
// leaves no output directory behind.
TEST(Prepare, OneTextFileSplitsIntoParagraphsByDefault) {
  TempDir dir;
  std::string input, val;
  int lines = 0;
  for (int i = 0; i < 40; ++i) {
    const std::string paragraph =
        fmt::format("CITIZEN {}:\nspeak, speak {}\n{}", i, std::string(size_t(i % 7), '!'),
                    i + 1 < 40 ? "\n" : "");
    lines += 2;
    input += paragraph;
    if (i == 19 || i == 39) val += paragraph;
  }
  write_text(dir / "input.txt", input);
  CommandResult r = run(fmt::format("{} prepare --input {} --output {} --no-progress",
                                    bottle_binary(), dir / "input.txt", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("40 document(s) (train 38, val 2); a document is a paragraph"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"), tokens_of(val));
  EXPECT_EQ(read_token_shard(dir / "out/data_train_000000.bin").size() + val.size(), input.size());
  r = run(fmt::format("{} prepare --input {} --output {} --documents line --val-fraction 0.5",
                      bottle_binary(), dir / "input.txt", dir / "lines"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(fmt::format("{} document(s)", lines)), std::string::npos) << r.output;

  // One paragraph: the refusal names the finer split and the way without validation (by
  // default the lines are already the documents, as one paragraph is too few).
  write_text(dir / "one.txt", "a single paragraph\nof two lines\n");
  for (const auto& [documents, finer] : {std::pair{"", ""},
                                         {"--documents file", "--documents paragraph or line"},
                                         {"--documents line", ""}}) {
    r = run(fmt::format("{} prepare --input {} --output {} {}", bottle_binary(), dir / "one.txt",
                        dir / "none", documents));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("too few for --val-fraction 0.05"), std::string::npos) << r.output;
    if (*finer) {
      EXPECT_NE(r.output.find(finer), std::string::npos) << r.output;
    }
    EXPECT_NE(r.output.find("pass --val-fraction 0 for no validation split"), std::string::npos)
        << r.output;
    EXPECT_FALSE(fs::exists(dir / "none")) << documents;
  }
  // An output directory that existed before is kept, empty or not.
  fs::create_directories(dir / "mine");
  r = run(fmt::format("{} prepare --input {} --output {}", bottle_binary(), dir / "one.txt",
                      dir / "mine"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_TRUE(fs::is_directory(dir / "mine"));
}

// Issue 45, case 5: one text file of a document per line, no blank line between them, is one
// paragraph: by default its lines are the documents then, and prepare says so. Before, the
// default refused it ("1 document(s) are too few ... (--documents line)").
TEST(Prepare, OneTextFileOfLinesSplitsIntoLinesByDefault) {
  TempDir dir;
  std::string input, val;
  for (int i = 0; i < 40; ++i) {
    const std::string line = fmt::format("document number {} on its own line\n", i);
    input += line;
    if (i == 19 || i == 39) val += line;
  }
  write_text(dir / "lines.txt", input);
  const CommandResult r = run(fmt::format("{} prepare --input {} --output {} --no-progress",
                                          bottle_binary(), dir / "lines.txt", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find(dir / "lines.txt" + ": 1 paragraph(s) are too few for --val-fraction "
                                              "0.05 (it takes 20 for one validation document): a "
                                              "document is a line"),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("40 document(s) (train 38, val 2); a document is a line of text"),
            std::string::npos)
      << r.output;
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"), tokens_of(val));
}

// A .json file in JSON Lines form (datasets.to_json) is read as records; other JSON is
// refused by name, saying what to do.
TEST(Prepare, JsonLinesInADotJsonFile) {
  TempDir dir;
  std::string jsonl, text;
  for (int i = 0; i < 4; ++i) {
    jsonl += fmt::format("{{\"text\": \"record {}\"}}\n", i);
    text += fmt::format("record {}", i);
  }
  write_text(dir / "train.json", jsonl);
  CommandResult r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0",
                                    bottle_binary(), dir / "train.json", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_token_shard(dir / "out/data_train_000000.bin"), tokens_of(text));
  EXPECT_NE(r.output.find("a document is a JSONL record's field 'text'"), std::string::npos)
      << r.output;
  write_text(dir / "array.json", "[\n" + jsonl + "]\n");
  r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0", bottle_binary(),
                      dir / "array.json", dir / "bad"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find(dir / "array.json" + ": a .json file is read as JSON Lines"),
            std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "bad"));
  // record forces JSONL; with --format text it contradicts itself.
  write_text(dir / "records.txt", jsonl);
  r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0 --documents record",
                      bottle_binary(), dir / "records.txt", dir / "rec"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_token_shard(dir / "rec/data_train_000000.bin"), tokens_of(text));
  r = run(fmt::format("{} prepare --input {} --output {} --documents record --format text",
                      bottle_binary(), dir / "records.txt", dir / "rec2"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("--documents record reads JSONL"), std::string::npos) << r.output;
}

TEST(Prepare, ValidationTakesEveryKthDocument) {
  TempDir dir;
  // 10 JSONL documents at f = 0.25: documents 3 and 7 (floor((i+1)/4) steps) for validation.
  std::string jsonl, train, val;
  for (int i = 0; i < 10; ++i) {
    const std::string text = fmt::format("document {} says {}", i, std::string(size_t(i), 'x'));
    jsonl += fmt::format("{{\"id\": {}, \"text\": \"{}\"}}\n", i, text);
    ((i == 3 || i == 7) ? val : train) += text;
    if (i == 4) jsonl += "\n";  // blank lines are skipped, not documents
  }
  write_text(dir / "docs.jsonl", jsonl);
  const CommandResult r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0.25",
                                          bottle_binary(), dir / "docs.jsonl", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_token_shard(dir / "out/data_train_000000.bin"), tokens_of(train));
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"), tokens_of(val));
  EXPECT_NE(r.output.find("10 document(s) (train 8, val 2)"), std::string::npos) << r.output;

  // --format jsonl reads any name as JSONL; --text-field picks the field.
  write_text(dir / "docs.data", "{\"body\": \"first body\"}\n{\"body\": \"second\"}\n");
  const CommandResult f = run(fmt::format(
      "{} prepare --input {} --output {} --format jsonl --text-field body --val-fraction 0.5",
      bottle_binary(), dir / "docs.data", dir / "out2"));
  ASSERT_EQ(f.status, 0) << f.output;
  EXPECT_EQ(read_token_shard(dir / "out2/data_train_000000.bin"), tokens_of("first body"));
  EXPECT_EQ(read_token_shard(dir / "out2/data_val_000000.bin"), tokens_of("second"));
}

TEST(Prepare, JsonlLineWithoutTheFieldNamesFileAndLine) {
  TempDir dir;
  write_text(dir / "bad.jsonl", "{\"text\": \"fine\"}\n{\"content\": \"no text field\"}\n");
  // A good data set from before must survive the failed run untouched.
  write_text(dir / "good.txt", "an earlier data set, prepared fine");
  CommandResult r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0",
                                    bottle_binary(), dir / "good.txt", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto before = files_of(dir / "out");
  r = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0", bottle_binary(),
                      dir / "bad.jsonl", dir / "out"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("bottle: error:"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(dir / "bad.jsonl" + ":2"), std::string::npos) << r.output;
  EXPECT_EQ(files_of(dir / "out"), before);
}

TEST(Prepare, ReadsGzipInput) {
  TempDir dir;
  const std::string a = sentences(1, 300), b = sentences(2, 200);
  write_text(dir / "a.txt", a);
  write_text(dir / "b.jsonl", fmt::format("{{\"text\": \"{}\"}}\n{{\"text\": \"{}\"}}\n", "one",
                                          "two, the validation document"));
  ASSERT_EQ(run(fmt::format("gzip -k {} {}", dir / "a.txt", dir / "b.jsonl")).status, 0);
  fs::remove(dir / "a.txt");
  fs::remove(dir / "b.jsonl");
  // Three documents: a.txt, then "one", then "two..." for validation (f = 0.34).
  const CommandResult r =
      run(fmt::format("{} prepare --input {} {} --output {} --val-fraction 0.34", bottle_binary(),
                      dir / "a.txt.gz", dir / "b.jsonl.gz", dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_token_shard(dir / "out/data_train_000000.bin"), tokens_of(a + "one"));
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"),
            tokens_of("two, the validation document"));
}

TEST(Prepare, SameShardsForAnyThreadCount) {
  TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 3000; ++i) jsonl += jsonl_line(sentences(i, i % 37));
  write_text(dir / "docs.jsonl", jsonl);
  write_text(dir / "big.txt", sentences(7, 20000));
  const std::string tiktoken = write_tiktoken(dir);
  for (const std::string& tokenizer : {std::string(), "--tokenizer " + tiktoken}) {
    std::map<std::string, std::string> first;
    for (int threads : {1, 2, 3}) {
      const std::string out = dir / fmt::format("out{}", threads);
      fs::remove_all(out);
      const CommandResult r = run(fmt::format(
          "{} prepare --input {} {} --output {} --shard-tokens 5000 --threads {} {}",
          bottle_binary(), dir / "docs.jsonl", dir / "big.txt", out, threads, tokenizer));
      ASSERT_EQ(r.status, 0) << r.output;
      auto files = files_of(out);
      EXPECT_GT(files.size(), 4u);
      if (threads == 1)
        first = std::move(files);
      else
        EXPECT_TRUE(files == first) << tokenizer << " threads " << threads;
    }
  }
}

TEST(Prepare, TokenizerTravelsWithTheData) {
  TempDir dir;
  const std::string tiktoken = write_tiktoken(dir);
  const auto tokenizer = load_tokenizer(tiktoken);
  ASSERT_TRUE(tokenizer->eos_id().has_value());
  const int32_t eot = *tokenizer->eos_id();
  std::vector<std::string> docs;
  std::string jsonl;
  for (int i = 0; i < 20; ++i) {
    docs.push_back(sentences(i, 40));
    jsonl += jsonl_line(docs.back());
  }
  write_text(dir / "docs.jsonl", jsonl);
  // A text file may hold invalid UTF-8 (JSON cannot): it becomes U+FFFD before encoding, as
  // the reference library sees it.
  write_text(dir / "raw.txt", "caf\xc3\xa9 \xff\xfe the end");
  docs.push_back("caf\xc3\xa9 \xef\xbf\xbd\xef\xbf\xbd the end");
  const CommandResult r =
      run(fmt::format("{} prepare --input {} {} --output {} --tokenizer {} --val-fraction 0.1",
                      bottle_binary(), dir / "docs.jsonl", dir / "raw.txt", dir / "out", tiktoken));
  ASSERT_EQ(r.status, 0) << r.output;
  // Documents 9 and 19 are for validation (f = 0.1), each after the <|endoftext|> delimiter.
  std::vector<int32_t> train, val;
  uint64_t train_bytes = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    const bool is_val = i == 9 || i == 19;
    std::vector<int32_t>& split = is_val ? val : train;
    split.push_back(eot);
    tokenizer->encode(docs[i], split);
    if (!is_val) train_bytes += docs[i].size();
  }
  const auto train_read = read_token_shard(dir / "out/data_train_000000.bin");
  EXPECT_EQ(train_read, train);
  EXPECT_LT(train_read.size(), train_bytes);  // the merges did merge
  EXPECT_EQ(read_token_shard(dir / "out/data_val_000000.bin"), val);
  EXPECT_EQ(tokenizer->decode(train_read).substr(0, 13), "<|endoftext|>");
  const SplitMeta meta = read_split_meta(dir / "out/data_train.json");
  EXPECT_EQ(meta.bytes, train_bytes);
  EXPECT_EQ(meta.tokens, train.size());
  EXPECT_EQ(meta.documents, 19u);
  EXPECT_EQ(meta.tokenizer_kind, "tiktoken");
  EXPECT_EQ(meta.vocab_size, tokenizer->vocab_size());
  // The tokenizer is saved beside the shards and encodes the same.
  const auto saved = load_tokenizer(dir / "out/tokenizer");
  EXPECT_EQ(saved->kind(), "tiktoken");
  EXPECT_EQ(saved->vocab_size(), tokenizer->vocab_size());
  EXPECT_EQ(saved->encode(sentences(3, 50)), tokenizer->encode(sentences(3, 50)));
  EXPECT_NE(r.output.find("tokenizer saved to"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("byte-unigram entropy"), std::string::npos) << r.output;
  // Bytes per token: more than one, as the metas count it.
  const auto bpt = bytes_per_token({dir / "out/data_train_000000.bin"});
  ASSERT_TRUE(bpt.has_value());
  EXPECT_DOUBLE_EQ(*bpt, double(train_bytes) / double(train.size()));
  EXPECT_GT(*bpt, 1.0);
  // A byte-level run into the same directory removes the tokenizer: it no longer describes it.
  write_text(dir / "plain.txt", sentences(1, 100));
  const CommandResult b = run(fmt::format("{} prepare --input {} --output {} --val-fraction 0",
                                          bottle_binary(), dir / "plain.txt", dir / "out"));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_FALSE(fs::exists(dir / "out/tokenizer"));
}

TEST(Prepare, TiktokenOptionsAndWideVocabulary) {
  TempDir dir;
  const std::string tiktoken = write_tiktoken(dir);
  write_text(dir / "a.txt", sentences(1, 200));
  // A special token past 65536 makes the vocabulary, and so every shard, uint32.
  const CommandResult r =
      run(fmt::format("{} prepare --input {} --output {} --tokenizer {} --tiktoken-pattern gpt2 "
                      "--tiktoken-special '<|endoftext|>=70000' --val-fraction 0",
                      bottle_binary(), dir / "a.txt", dir / "out", tiktoken));
  ASSERT_EQ(r.status, 0) << r.output;
  const std::string shard = dir / "out/data_train_000000.bin";
  EXPECT_EQ(header_word(shard, 0), 20240801);
  EXPECT_EQ(header_word(shard, 1), 7);
  const auto t = read_token_shard(shard);
  ASSERT_FALSE(t.empty());
  EXPECT_EQ(t[0], 70000);
  EXPECT_NE(r.output.find("vocabulary: 70001"), std::string::npos) << r.output;
  // A malformed special token is refused naming the option.
  const CommandResult bad =
      run(fmt::format("{} prepare --input {} --output {} --tokenizer {} --tiktoken-special oops",
                      bottle_binary(), dir / "a.txt", dir / "out", tiktoken));
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find("--tiktoken-special 'oops'"), std::string::npos) << bad.output;
}

TEST(Prepare, MetaFilesAndBytesPerToken) {
  TempDir dir;
  for (int d = 0; d < 10; ++d) write_text(dir / fmt::format("d{}.txt", d), sentences(d, 30 + d));
  const CommandResult r = run(fmt::format(
      "{} prepare --input '{}/d*.txt' --output {} --val-fraction 0.2 --shard-tokens 400 --prefix m "
      "--progress",
      bottle_binary(), dir.str(), dir / "out"));
  ASSERT_EQ(r.status, 0) << r.output;
  // --progress shows the line even off a terminal, at least its final state.
  EXPECT_NE(r.output.find("10 docs | "), std::string::npos) << r.output;
  const SplitMeta train = read_split_meta(dir / "out/m_train.json");
  const SplitMeta val = read_split_meta(dir / "out/m_val.json");
  EXPECT_EQ(train.split, "train");
  EXPECT_EQ(train.documents, 8u);
  EXPECT_EQ(val.documents, 2u);
  EXPECT_EQ(train.tokens, train.bytes);  // bytes: one token per byte
  EXPECT_EQ(train.vocab_size, 256);
  EXPECT_EQ(train.tokenizer_kind, "bytes");
  EXPECT_EQ(train.tokenizer, make_byte_tokenizer()->describe());
  ASSERT_GE(train.shards.size(), 2u);
  std::vector<std::string> shards;
  for (const ShardEntry& s : train.shards) {
    shards.push_back(dir / ("out/" + s.file));
    EXPECT_EQ(token_shard_size(shards.back()), s.tokens);
  }
  EXPECT_EQ(train.shards[0].file, "m_train_000000.bin");
  EXPECT_EQ(bytes_per_token(shards), 1.0);
  EXPECT_EQ(bytes_per_token({dir / "out/m_val_000000.bin", shards[0]}), 1.0);
  // A shard rewritten since (another token count), one without a meta, one not named as
  // prepare names shards: no ratio.
  write_token_shard(shards[1], {1, 2, 3});
  EXPECT_EQ(bytes_per_token(shards), std::nullopt);
  EXPECT_EQ(bytes_per_token({shards[0]}), 1.0);
  write_token_shard(dir / "out/x_train_000000.bin", {1, 2, 3});
  EXPECT_EQ(bytes_per_token({dir / "out/x_train_000000.bin"}), std::nullopt);
  write_token_shard(dir / "out/plain.bin", {1, 2, 3});
  EXPECT_EQ(bytes_per_token({dir / "out/plain.bin"}), std::nullopt);
  // A malformed meta is an error naming it.
  write_text(dir / "out/m_val.json", "{\"split\": \"val\", \"documents\": -1}");
  try {
    bytes_per_token({dir / "out/m_val_000000.bin"});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir / "out/m_val.json"), std::string::npos) << e.what();
  }
  write_text(dir / "out/m_val.json", "{\"split\": \"val\"}");
  EXPECT_THROW(read_split_meta(dir / "out/m_val.json"), Error);
  write_text(dir / "out/m_val.json", "not json");
  EXPECT_THROW(read_split_meta(dir / "out/m_val.json"), Error);
}

TEST(ShardWriter, TokenWidthFollowsTheVocabulary) {
  TempDir dir;
  const std::vector<int32_t> small{1, 2, 3, 4, 5};
  for (const auto& [vocab, magic] : {std::pair{70000, 20240801}, std::pair{65536, 20240520}}) {
    const std::string prefix = fmt::format("v{}", vocab);
    ShardWriter w(dir.str(), prefix, "train", 1000, vocab);
    w.append(small, 10);
    w.append(std::vector<int32_t>{vocab - 1}, 2);
    const SplitMeta& meta = w.stage("test", "a test tokenizer");
    w.commit();
    w.remove_stale();
    EXPECT_EQ(meta.tokens, 6u);
    EXPECT_EQ(meta.documents, 2u);
    EXPECT_EQ(meta.bytes, 12u);
    const std::string shard = dir / (prefix + "_train_000000.bin");
    EXPECT_EQ(header_word(shard, 0), magic) << vocab;
    EXPECT_EQ(fs::file_size(shard), 1024 + 6 * (vocab > 65536 ? 4 : 2));
    EXPECT_EQ(read_token_shard(shard), (std::vector<int32_t>{1, 2, 3, 4, 5, vocab - 1}));
  }
  // An id outside the vocabulary is refused.
  ShardWriter w(dir.str(), "bad", "train", 10, 100);
  EXPECT_THROW(w.append(std::vector<int32_t>{100}, 1), Error);
  EXPECT_THROW(w.append(std::vector<int32_t>{-1}, 1), Error);
}

TEST(ShardWriter, FixedShardsAppearOnlyAtCommit) {
  TempDir dir;
  std::vector<int32_t> all;
  {
    ShardWriter w(dir.str(), "p", "val", 4, 256);
    for (int d = 0; d < 5; ++d) {
      std::vector<int32_t> doc(size_t(d + 1), d);  // 1 + 2 + 3 + 4 + 5 = 15 tokens
      w.append(doc, uint64_t(d));
      all.insert(all.end(), doc.begin(), doc.end());
    }
    w.append_bytes("ab");
    all.push_back('a');
    all.push_back('b');
    EXPECT_EQ(w.tokens(), 17u);
    EXPECT_EQ(w.documents(), 6u);
    // Nothing under a shard's name yet: a crash here leaves the directory as it was.
    for (const auto& e : fs::directory_iterator(dir.str()))
      EXPECT_TRUE(e.path().string().ends_with(".tmp")) << e.path();
    // Staged: every shard and the description written, still under temporary names.
    const SplitMeta& meta = w.stage("bytes", "bytes");
    EXPECT_TRUE(fs::exists(dir / "p_val.json.tmp"));
    for (const auto& e : fs::directory_iterator(dir.str()))
      EXPECT_TRUE(e.path().string().ends_with(".tmp")) << e.path();
    w.commit();
    w.remove_stale();
    EXPECT_FALSE(fs::exists(dir / "p_val.json.tmp"));
    ASSERT_EQ(meta.shards.size(), 5u);  // 4 + 4 + 4 + 4 + 1
    EXPECT_EQ(meta.shards.back().tokens, 1u);
    EXPECT_EQ(meta.bytes, 0u + 1 + 2 + 3 + 4 + 2);
  }
  std::vector<int32_t> joined;
  for (int i = 0; i < 5; ++i) {
    const auto t = read_token_shard(dir / fmt::format("p_val_{:06d}.bin", i));
    joined.insert(joined.end(), t.begin(), t.end());
  }
  EXPECT_EQ(joined, all);
  EXPECT_EQ(read_split_meta(dir / "p_val.json").shards.size(), 5u);
  // Tokens filling the last shard exactly: no empty shard after it.
  {
    ShardWriter w(dir.str(), "e", "train", 5, 256);
    w.append(std::vector<int32_t>(7, 1), 7);
    w.append(std::vector<int32_t>(3, 2), 3);
    EXPECT_EQ(w.stage("bytes", "bytes").shards.size(), 2u);
    w.commit();
    EXPECT_FALSE(fs::exists(dir / "e_train_000002.bin"));
  }
  // A writer never committed leaves nothing behind, staged or not.
  {
    ShardWriter w(dir.str(), "q", "train", 4, 256);
    w.append(std::vector<int32_t>(10, 7), 10);
  }
  {
    ShardWriter w(dir.str(), "q", "val", 4, 256);
    w.append(std::vector<int32_t>(10, 7), 10);
    w.stage("bytes", "bytes");
  }
  for (const auto& e : fs::directory_iterator(dir.str()))
    EXPECT_FALSE(e.path().filename().string().starts_with("q_")) << e.path();
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
