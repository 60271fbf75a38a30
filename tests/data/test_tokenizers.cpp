// Tokenizers on hand-written files, with ids derived by hand (no Python: the exactness against
// the libraries is tests/data/tokenizer_oracle.py's): a byte-level and a SentencePiece-style
// tokenizer.json and a tiktoken rank file, encode and decode (leftmost-lowest-rank merging,
// ignore_merges, byte fallback, unk / fuse_unk, special tokens' strings encoded as text,
// non-special added tokens matched), the shared merge loop on a long run, the document
// delimiter, save() then find_tokenizer(). Bad tokenizer files, JSONL and vocabularies through
// the bottle binary: exit status 1 and one message naming the file. And the round trip: prepare
// with a tokenizer, train, the tokenizer in every checkpoint, eval's bits per byte, sample.
#include <chrono>
#include <cmath>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"
#include "data/bpe_merges.h"
#include "data/shard_meta.h"
#include "data/tokenizer.h"
#include "data/utf8.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

using nlohmann::json;
using Ids = std::vector<int32_t>;

// Tiny models on a busy machine: spinning OpenMP workers make every run ~10x slower. The
// bottle processes inherit this.
const bool passive_omp = [] { return ::setenv("OMP_WAIT_POLICY", "passive", 0) == 0; }();

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::string kSpace = byte_level_chars()[' '];  // Ġ
constexpr const char* kMark = "\xE2\x96\x81";        // ▁ (U+2581)

json added_token(int32_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// A GPT-2-style byte-level tokenizer.json: ids 0..255 are the bytes (their GPT-2 characters),
// then "Ġt" 256, "he" 257, "Ġthe" 258 and "aa" 259 by the merges "Ġ t", "h e", "Ġt he",
// "a a" (ranks 0..3), "abc" 260 with no merge (for ignore_merges); added tokens
// "<|endoftext|>" 261 (special), "[X]" 262 (not special, normalized = false) and "<|pad|>" 263
// (special, not a usual BOS/EOS name). Vocabulary 264.
json byte_level_json(bool ignore_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level_chars()[size_t(b)]] = b;
  vocab[kSpace + "t"] = 256;
  vocab["he"] = 257;
  vocab[kSpace + "the"] = 258;
  vocab["aa"] = 259;
  vocab["abc"] = 260;
  // The newer merges format: pairs.
  const json merges = json::array({json::array({kSpace, "t"}), json::array({"h", "e"}),
                                   json::array({kSpace + "t", "he"}), json::array({"a", "a"})});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens",
           json::array({added_token(261, "<|endoftext|>", true), added_token(262, "[X]", false),
                        added_token(263, "<|pad|>", true)})},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           {{"type", "ByteLevel"},
            {"add_prefix_space", false},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"post_processor", nullptr},
          {"decoder",
           {{"type", "ByteLevel"},
            {"add_prefix_space", true},
            {"trim_offsets", true},
            {"use_regex", true}}},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", vocab},
            {"merges", merges}}}};
}

// A LLaMA-2-style (SentencePiece-style) tokenizer.json: "<unk>" 0, "<s>" 1, "</s>" 2, the byte
// tokens <0x00>..<0xFF> at 3..258, then "▁" 259, "a" 260, "b" 261, "▁a" 262, "ab" 263,
// "▁ab" 264 by the merges "▁ a", "a b", "▁a b" (ranks 0..2, the older "left right" strings).
// Normalizer Prepend("▁") + Replace(" ", "▁"), no pre-tokenizer, the decoder chain Replace
// ByteFallback Fuse Strip. Vocabulary 265.
json sentencepiece_style_json(bool byte_fallback = true, bool fuse_unk = true) {
  json vocab = json::object();
  vocab["<unk>"] = 0;
  vocab["<s>"] = 1;
  vocab["</s>"] = 2;
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  const std::string m = kMark;
  vocab[m] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab[m + "a"] = 262;
  vocab["ab"] = 263;
  vocab[m + "ab"] = 264;
  return {
      {"version", "1.0"},
      {"truncation", nullptr},
      {"padding", nullptr},
      {"added_tokens", json::array({added_token(0, "<unk>", true), added_token(1, "<s>", true),
                                    added_token(2, "</s>", true)})},
      {"normalizer",
       {{"type", "Sequence"},
        {"normalizers",
         json::array({{{"type", "Prepend"}, {"prepend", m}},
                      {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", m}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", nullptr},
      {"decoder",
       {{"type", "Sequence"},
        {"decoders",
         json::array({{{"type", "Replace"}, {"pattern", {{"String", m}}}, {"content", " "}},
                      {{"type", "ByteFallback"}},
                      {{"type", "Fuse"}},
                      {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model",
       {{"type", "BPE"},
        {"dropout", nullptr},
        {"unk_token", "<unk>"},
        {"continuing_subword_prefix", nullptr},
        {"end_of_word_suffix", nullptr},
        {"fuse_unk", fuse_unk},
        {"byte_fallback", byte_fallback},
        {"ignore_merges", false},
        {"vocab", vocab},
        {"merges", json::array({m + " a", "a b", m + "a b"})}}}};
}

// `j` as DIR/NAME (created), returning the file's path.
std::string write_json(const TempDir& dir, const std::string& name, const json& j) {
  const fs::path path = fs::path(dir.str()) / name;
  fs::create_directories(path.parent_path());
  write_text(path.string(), j.dump(2));
  return path.string();
}

// A tiktoken rank file: the bytes at ranks 0..255, then "aa" 256, "th" 257, "he" 258, "the" 259,
// "34" 260, " the" 261.
std::string write_tiktoken(const TempDir& dir, const std::string& name = "tiny.tiktoken") {
  std::string text;
  int rank = 0;
  for (int b = 0; b < 256; ++b)
    text += fmt::format("{} {}\n", base64(std::string(1, char(b))), rank++);
  for (const char* token : {"aa", "th", "he", "the", "34", " the"})
    text += fmt::format("{} {}\n", base64(token), rank++);
  write_text(dir / name, text);
  return dir / name;
}

Ids byte_ids(std::string_view text) {
  Ids ids;
  for (unsigned char c : text) ids.push_back(c);
  return ids;
}

// ---------------------------------------------------------------------------------------
// Units on hand-written files.

TEST(ByteLevelBpe, EncodesAndDecodesByMergeRank) {
  TempDir dir;
  const auto t = load_tokenizer(write_json(dir, "tokenizer.json", byte_level_json()));
  EXPECT_EQ(t->kind(), "bpe");
  EXPECT_EQ(t->vocab_size(), 264);
  // " the": Ġ t h e; "Ġ t" (rank 0), then "h e" (1), then "Ġt he" (2).
  EXPECT_EQ(t->encode(" the"), Ids{258});
  // Without the space: "h e" only.
  EXPECT_EQ(t->encode("the"), (Ids{'t', 257}));
  EXPECT_EQ(t->encode("then the"), (Ids{'t', 257, 'n', 258}));
  // Equal ranks: the leftmost pair first.
  EXPECT_EQ(t->encode("aaa"), (Ids{259, 'a'}));
  EXPECT_EQ(t->encode("aaaa"), (Ids{259, 259}));
  EXPECT_EQ(t->encode("aaaaa"), (Ids{259, 259, 'a'}));
  // "abc" is in the vocabulary but no merge makes it.
  EXPECT_EQ(t->encode("abc"), (Ids{'a', 'b', 'c'}));
  // Multi-byte characters are their bytes' GPT-2 characters.
  EXPECT_EQ(t->encode("\xC3\xA9"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(t->decode(Ids{0xC3, 0xA9}), "\xC3\xA9");
  // Decoding: the bytes back; half a character becomes U+FFFD.
  EXPECT_EQ(t->decode(Ids{'t', 257, 'n', 258}), "then the");
  EXPECT_EQ(t->decode(Ids{0xC3}), "\xEF\xBF\xBD");
  EXPECT_EQ(t->decode(Ids{261}), "<|endoftext|>");
  EXPECT_EQ(t->decode(Ids{}), "");
  const std::string text = "the the aaa\n\t  x\xC3\xA9 12345 [y]";
  EXPECT_EQ(t->decode(t->encode(text)), text);
  // An id outside the vocabulary is an error naming it.
  EXPECT_TRUE(contains(error_of([&] { t->decode(Ids{264}); }), "token 264"))
      << error_of([&] { t->decode(Ids{264}); });
  EXPECT_THROW(t->decode(Ids{-1}), Error);
}

TEST(ByteLevelBpe, IgnoreMergesTakesAWholeVocabularyWord) {
  TempDir dir;
  const auto t = load_tokenizer(write_json(dir, "tokenizer.json", byte_level_json(true)));
  EXPECT_EQ(t->encode("abc"), Ids{260});
  EXPECT_EQ(t->encode("abc abc"), (Ids{260, ' ', 'a', 'b', 'c'}));  // "Ġabc" is not a word
  EXPECT_EQ(t->encode("the"), (Ids{'t', 257}));  // not in the vocabulary: merged as before
  EXPECT_EQ(t->encode("aa"), Ids{259});
}

TEST(ByteLevelBpe, SpecialTokensAreTextAddedTokensAreMatched) {
  TempDir dir;
  const auto t = load_tokenizer(write_json(dir, "tokenizer.json", byte_level_json()));
  // A special token's string in a document is ordinary text ("<|", "endoftext", "|>").
  EXPECT_EQ(t->encode("<|endoftext|>"), byte_ids("<|endoftext|>"));
  EXPECT_EQ(t->encode("a<|pad|>"), byte_ids("a<|pad|>"));
  // A non-special added token (normalized = false) is found in the raw text first.
  EXPECT_EQ(t->encode("[X]"), Ids{262});
  EXPECT_EQ(t->encode("a[X]b"), (Ids{'a', 262, 'b'}));
  EXPECT_EQ(t->encode(" the[X][X] the"), (Ids{258, 262, 262, 258}));
  EXPECT_EQ(t->decode(Ids{258, 262, 258}), " the[X] the");
  EXPECT_EQ(t->encode("[X"), byte_ids("[X"));
}

TEST(SentencePieceStyleBpe, PrependReplaceAndByteFallback) {
  TempDir dir;
  const auto t = load_tokenizer(write_json(dir, "tokenizer.json", sentencepiece_style_json()));
  EXPECT_EQ(t->vocab_size(), 265);
  // "▁ab": "▁ a" (rank 0) first, then "▁a b" (2); the stale "a b" (1) is skipped.
  EXPECT_EQ(t->encode("ab"), Ids{264});
  EXPECT_EQ(t->encode("ab ab"), (Ids{264, 264}));
  EXPECT_EQ(t->encode("b a"), (Ids{259, 261, 262}));
  EXPECT_EQ(t->encode("ba"), (Ids{259, 261, 260}));
  EXPECT_EQ(t->encode("bab"), (Ids{259, 261, 263}));
  EXPECT_EQ(t->decode(Ids{264, 264}), "ab ab");
  EXPECT_EQ(t->decode(Ids{259, 261, 262}), "b a");
  // "é" is not in the vocabulary: its UTF-8 bytes, as <0xC3> <0xA9>.
  EXPECT_EQ(t->encode("a\xC3\xA9"), (Ids{262, 3 + 0xC3, 3 + 0xA9}));
  EXPECT_EQ(t->decode(Ids{262, 3 + 0xC3, 3 + 0xA9}), "a\xC3\xA9");
  EXPECT_EQ(t->encode("\xF0\x9F\x98\x80"), (Ids{259, 3 + 0xF0, 3 + 0x9F, 3 + 0x98, 3 + 0x80}));
  // Half a character: one U+FFFD per byte.
  EXPECT_EQ(t->decode(Ids{262, 3 + 0xF0, 3 + 0x9F}), "a\xEF\xBF\xBD\xEF\xBF\xBD");
  // A special token's string is text: its bytes, not <s>.
  EXPECT_EQ(t->encode("<s>"), (Ids{259, 3 + '<', 3 + 's', 3 + '>'}));
  EXPECT_EQ(t->decode(Ids{1, 264}), "<s> ab");
  const std::string text = "ab b\xC3\xA9 a  \xE4\xB8\xAD b";
  EXPECT_EQ(t->decode(t->encode(text)), text);
}

TEST(SentencePieceStyleBpe, UnknownCharactersWithoutByteFallback) {
  TempDir dir;
  const std::string euro = "\xE2\x82\xAC";
  const auto fused = load_tokenizer(
      write_json(dir, "fused/tokenizer.json", sentencepiece_style_json(false, true)));
  EXPECT_EQ(fused->encode("a" + euro + euro + "b"), (Ids{262, 0, 261}));
  EXPECT_EQ(fused->encode(euro + "a"), (Ids{259, 0, 260}));
  const auto apart = load_tokenizer(
      write_json(dir, "apart/tokenizer.json", sentencepiece_style_json(false, false)));
  EXPECT_EQ(apart->encode("a" + euro + euro + "b"), (Ids{262, 0, 0, 261}));
  EXPECT_EQ(apart->decode(Ids{262, 0, 0, 261}), "a<unk><unk>b");
}

TEST(Tiktoken, EncodesByTheRankOfTheMergedBytes) {
  TempDir dir;
  const auto t = load_tokenizer(write_tiktoken(dir));
  EXPECT_EQ(t->kind(), "tiktoken");
  // The default: cl100k_base's pattern, <|endoftext|> after the last rank.
  EXPECT_EQ(t->vocab_size(), 263);
  EXPECT_EQ(t->eos_id(), 262);
  EXPECT_EQ(t->bos_id(), std::nullopt);
  EXPECT_EQ(t->document_delimiter(), 262);
  EXPECT_EQ(t->encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t->encode("aaaa"), (Ids{256, 256}));
  // "then": "th" (257), then "the" (259); "then" has no rank.
  EXPECT_EQ(t->encode("then"), (Ids{259, 'n'}));
  EXPECT_EQ(t->encode(" the"), Ids{261});  // a whole piece with a rank
  // cl100k splits digits by three: "123" "45", so "34" never meets.
  EXPECT_EQ(t->encode("12345"), byte_ids("12345"));
  EXPECT_EQ(t->encode("<|endoftext|>"), byte_ids("<|endoftext|>"));
  EXPECT_EQ(t->decode(Ids{259, 'n', 262}), "then<|endoftext|>");
  EXPECT_EQ(t->decode(Ids{0xC3}), "\xEF\xBF\xBD");
  EXPECT_THROW(t->decode(Ids{263}), Error);
}

TEST(BpeMerge, LongRunIsFastAndLeftmostFirst) {
  // 10,001 equal symbols; a pair of equal symbols of level k < 4 merges into level k + 1 at
  // rank k: 625 symbols of level 4 (16 each), and the last one left alone.
  const uint32_t n = 10001;
  std::vector<BpeSymbol> symbols;
  for (uint32_t i = 0; i < n; ++i) symbols.push_back({0, i, i + 1});
  const auto merge_of = [](const BpeSymbol& a, const BpeSymbol& b) -> std::optional<BpeMerge> {
    if (a.id != b.id || a.id >= 4) return std::nullopt;
    return BpeMerge{uint32_t(a.id), a.id + 1};
  };
  const auto begin = std::chrono::steady_clock::now();
  bpe_merge(symbols, merge_of);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  ASSERT_EQ(symbols.size(), 626u);
  for (uint32_t i = 0; i < 625; ++i) {
    EXPECT_EQ(symbols[i].id, 4);
    EXPECT_EQ(symbols[i].begin, 16 * i);
    EXPECT_EQ(symbols[i].end, 16 * i + 16);
  }
  EXPECT_EQ(symbols.back().id, 0);
  EXPECT_EQ(symbols.back().begin, 10000u);
  EXPECT_LT(seconds, 1.0);
  // Three equal pairs overlapping: 0 1 2 -> (0 1) 2, never 0 (1 2).
  std::vector<BpeSymbol> three{{0, 0, 1}, {0, 1, 2}, {0, 2, 3}};
  bpe_merge(three, merge_of);
  ASSERT_EQ(three.size(), 2u);
  EXPECT_EQ(three[0].id, 1);
  EXPECT_EQ(three[0].end, 2u);
  EXPECT_EQ(three[1].id, 0);
  // A whole document under a SentencePiece-style tokenizer is one pre-token.
  TempDir dir;
  const auto t = load_tokenizer(write_json(dir, "tokenizer.json", sentencepiece_style_json()));
  std::string text;
  for (int i = 0; i < 5000; ++i) text += "ab ";
  const auto long_begin = std::chrono::steady_clock::now();
  const Ids ids = t->encode(text);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - long_begin).count(),
            2.0);
  ASSERT_EQ(ids.size(), 5001u);
  EXPECT_EQ(ids[0], 264);
  EXPECT_EQ(ids[4999], 264);
  EXPECT_EQ(ids[5000], 259);  // the trailing "▁"
}

TEST(DocumentDelimiter, BosBeforeEosAndTheConfigsNames) {
  TempDir dir;
  // <s> and </s>: BOS.
  const auto sp = load_tokenizer(write_json(dir, "sp/tokenizer.json", sentencepiece_style_json()));
  EXPECT_EQ(sp->bos_id(), 1);
  EXPECT_EQ(sp->eos_id(), 2);
  EXPECT_EQ(sp->document_delimiter(), 1);
  // Only <|endoftext|>: EOS.
  const auto gpt = load_tokenizer(write_json(dir, "gpt/tokenizer.json", byte_level_json()));
  EXPECT_EQ(gpt->bos_id(), std::nullopt);
  EXPECT_EQ(gpt->eos_id(), 261);
  EXPECT_EQ(gpt->document_delimiter(), 261);
  // tokenizer_config.json beside it names the tokens (a string or HF's {"content": ...}).
  write_json(dir, "named/tokenizer_config.json",
             {{"bos_token", {{"content", "<|pad|>"}, {"special", true}}},
              {"eos_token", "[X]"},
              {"unk_token", nullptr}});
  const auto named = load_tokenizer(write_json(dir, "named/tokenizer.json", byte_level_json()));
  EXPECT_EQ(named->bos_id(), 263);
  EXPECT_EQ(named->eos_id(), 262);
  EXPECT_EQ(named->document_delimiter(), 263);
  EXPECT_EQ(find_tokenizer(dir / "named")->document_delimiter(), 263);
  // A name that is not in the vocabulary is an error naming the file.
  write_json(dir, "wrong/tokenizer_config.json", {{"eos_token", "<nope>"}});
  const std::string path = write_json(dir, "wrong/tokenizer.json", byte_level_json());
  const std::string e = error_of([&] { load_tokenizer(path); });
  EXPECT_TRUE(contains(e, path) && contains(e, "tokenizer_config.json") && contains(e, "<nope>"))
      << e;
  // tiktoken: <|startoftext|> is its BOS.
  const auto tt = load_tiktoken(
      write_tiktoken(dir), {"cl100k_base", {{"<|endoftext|>", 300}, {"<|startoftext|>", 301}}});
  EXPECT_EQ(tt->eos_id(), 300);
  EXPECT_EQ(tt->bos_id(), 301);
  EXPECT_EQ(tt->document_delimiter(), 301);
  EXPECT_EQ(tt->vocab_size(), 302);
  // bytes: none.
  EXPECT_EQ(make_byte_tokenizer()->document_delimiter(), std::nullopt);
}

const std::vector<std::string> kSamples = {"the the then", "aaa abc ab ab",
                                           "a[X]b <|endoftext|> <s>",
                                           "b\xC3\xA9 \xF0\x9F\x98\x80 12345", "  \t\n x"};

void expect_same_tokenizer(const Tokenizer& a, const Tokenizer& b) {
  EXPECT_EQ(a.kind(), b.kind());
  EXPECT_EQ(a.vocab_size(), b.vocab_size());
  EXPECT_EQ(a.bos_id(), b.bos_id());
  EXPECT_EQ(a.eos_id(), b.eos_id());
  for (const std::string& s : kSamples) {
    EXPECT_EQ(a.encode(s), b.encode(s)) << s;
    EXPECT_EQ(a.decode(a.encode(s)), b.decode(b.encode(s))) << s;
  }
}

TEST(SaveAndFind, TokenizerJsonRoundTrip) {
  TempDir dir;
  for (const auto& [name, j] :
       {std::pair{"gpt", byte_level_json()}, std::pair{"sp", sentencepiece_style_json()}}) {
    SCOPED_TRACE(name);
    const std::string src = write_json(dir, std::string(name) + "/tokenizer.json", j);
    if (std::string(name) == "gpt")
      write_json(dir, "gpt/tokenizer_config.json", {{"bos_token", "<|pad|>"}});
    const auto original = load_tokenizer(src);
    const std::string out = dir / (std::string(name) + "_saved");
    fs::create_directories(out);
    EXPECT_EQ(find_tokenizer(out), nullptr);
    original->save(out);
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      EXPECT_TRUE(fs::is_regular_file(fs::path(out) / f)) << f;
    EXPECT_EQ(read_bytes(out + "/tokenizer.json"), read_bytes(src));  // verbatim
    const auto found = find_tokenizer(out);
    ASSERT_NE(found, nullptr);
    expect_same_tokenizer(*original, *found);
    expect_same_tokenizer(*original, *load_tokenizer(out));
    const json config = json::parse(read_bytes(out + "/tokenizer_config.json"));
    const json map = json::parse(read_bytes(out + "/special_tokens_map.json"));
    EXPECT_EQ(config["tokenizer_class"], "PreTrainedTokenizerFast");
    EXPECT_EQ(config["model_input_names"], json({"input_ids", "attention_mask"}));
    if (std::string(name) == "gpt") {
      EXPECT_EQ(config["bos_token"], "<|pad|>");
      EXPECT_EQ(config["eos_token"], "<|endoftext|>");
      EXPECT_TRUE(config["unk_token"].is_null());
      EXPECT_EQ(map, json({{"bos_token", "<|pad|>"},
                           {"eos_token", "<|endoftext|>"},
                           {"pad_token", "<|endoftext|>"}}));
      EXPECT_EQ(config["added_tokens_decoder"]["262"]["content"], "[X]");
      EXPECT_FALSE(config["added_tokens_decoder"]["262"].contains("id"));
      EXPECT_EQ(found->bos_id(), 263);
    } else {
      EXPECT_EQ(map, json({{"bos_token", "<s>"},
                           {"eos_token", "</s>"},
                           {"pad_token", "</s>"},
                           {"unk_token", "<unk>"}}));
      EXPECT_EQ(found->bos_id(), 1);
    }
  }
}

// The per-thread pre-token cache belongs to one tokenizer: another one made where a destroyed
// one lived (the same address, as a test process's tokenizers often are) reads its own ids.
TEST(SaveAndFind, TokenizersDoNotShareTheirCache) {
  TempDir dir;
  const std::string with = write_json(dir, "with/tokenizer.json", byte_level_json());
  json plain = byte_level_json();
  plain["model"]["merges"] = json::array();
  const std::string without = write_json(dir, "without/tokenizer.json", plain);
  const Ids merged = load_tokenizer(with)->encode("the then"),
            bytes = load_tokenizer(without)->encode("the then");
  ASSERT_NE(merged, bytes);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(load_tokenizer(i % 2 ? with : without)->encode("the then"), i % 2 ? merged : bytes);
  }
}

// Bytes save a tokenizer.json of the same ids for transformers, marked in
// tokenizer_config.json so that bottle reads them back as bytes.
TEST(SaveAndFind, BytesSaveATokenizerJsonOfTheSameIds) {
  TempDir dir;
  const std::string out = dir / "saved";
  fs::create_directories(out);
  make_byte_tokenizer()->save(out);
  const auto found = find_tokenizer(out);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->kind(), "bytes");
  const auto as_json = load_tokenizer(out + "/tokenizer.json");
  EXPECT_EQ(as_json->kind(), "bpe");
  EXPECT_EQ(as_json->vocab_size(), 256);
  for (const std::string& text : {std::string("the the then"),
                                  std::string("caf\xC3\xA9 \xE6\x9D\xB1 \xF0\x9F\x8E\x89\n\t ")}) {
    EXPECT_EQ(as_json->encode(text), found->encode(text)) << text;
    EXPECT_EQ(as_json->decode(found->encode(text)), text);
  }
  write_json(dir, "saved/tokenizer_config.json", {{"bottle_tokenizer", "words"}});
  const std::string error = error_of([&] { find_tokenizer(out); });
  EXPECT_NE(error.find("tokenizer_config.json: key 'bottle_tokenizer' is \"words\""),
            std::string::npos)
      << error;
}

TEST(SaveAndFind, TiktokenKeepsItsPatternAndSpecials) {
  TempDir dir;
  const auto original = load_tiktoken(
      write_tiktoken(dir), {"gpt2", {{"<|endoftext|>", 1000}, {"<|startoftext|>", 1001}}});
  // gpt2's pattern keeps a digit run whole, so "34" merges.
  EXPECT_EQ(original->encode("12345"), (Ids{'1', '2', 260, '5'}));
  const std::string out = dir / "saved";
  fs::create_directories(out);
  original->save(out);
  for (const char* f :
       {"tokenizer.tiktoken", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
    EXPECT_TRUE(fs::is_regular_file(fs::path(out) / f)) << f;
  EXPECT_EQ(read_bytes(out + "/tokenizer.tiktoken"), read_bytes(dir / "tiny.tiktoken"));
  const auto found = find_tokenizer(out);
  ASSERT_NE(found, nullptr);
  EXPECT_EQ(found->kind(), "tiktoken");  // the rank file, not the tokenizer.json beside it
  expect_same_tokenizer(*original, *found);
  // The tokenizer.json written for transformers is the same tokenizer (hf_roundtrip checks
  // it against transformers itself).
  const auto as_json = load_tokenizer(out + "/tokenizer.json");
  EXPECT_EQ(as_json->kind(), "bpe");
  EXPECT_EQ(as_json->vocab_size(), original->vocab_size());
  EXPECT_EQ(as_json->eos_id(), original->eos_id());
  for (const std::string& text : kSamples) {
    EXPECT_EQ(as_json->encode(text), original->encode(text)) << text;
    EXPECT_EQ(as_json->decode(original->encode(text)), original->decode(original->encode(text)));
  }
  EXPECT_EQ(as_json->encode("12345"), (Ids{'1', '2', 260, '5'}));
  EXPECT_EQ(found->vocab_size(), 1002);
  EXPECT_EQ(found->bos_id(), 1001);
  EXPECT_EQ(found->eos_id(), 1000);
  EXPECT_EQ(found->encode("12345"), (Ids{'1', '2', 260, '5'}));
  EXPECT_EQ(found->decode(Ids{1001, 259}), "<|startoftext|>the");
  const json config = json::parse(read_bytes(out + "/tokenizer_config.json"));
  EXPECT_EQ(config["tiktoken"]["special_tokens"],
            json({{"<|endoftext|>", 1000}, {"<|startoftext|>", 1001}}));
  EXPECT_EQ(config["bos_token"], "<|startoftext|>");
  EXPECT_EQ(config["eos_token"], "<|endoftext|>");
  // Without the configuration the file alone gets the defaults (cl100k_base).
  fs::remove(out + "/tokenizer_config.json");
  EXPECT_EQ(find_tokenizer(out)->encode("12345"), byte_ids("12345"));
}

// ---------------------------------------------------------------------------------------
// Bad input through the binary: exit status 1, one message naming the file.

void expect_one_error(const CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count_occurrences(r.output, "bottle: error:"), 1) << r.output;
  for (const std::string& needle : needles)
    EXPECT_TRUE(contains(r.output, needle)) << needle << "\n" << r.output;
  for (const char* bad : {"internal error", "terminate called", "Sanitizer",
                          "runtime error:", "Aborted", "core dumped"})
    EXPECT_FALSE(contains(r.output, bad)) << bad << "\n" << r.output;
}

CommandResult tokenize(const std::string& tokenizer, const std::string& input) {
  return run(
      fmt::format("{} tokenize --tokenizer {} --input {}", bottle_binary(), tokenizer, input));
}

TEST(BadTokenizer, FilesAreRefusedNamingThem) {
  TempDir dir;
  write_text(dir / "in.txt", "the text");
  const std::string good = byte_level_json().dump(2);
  // Cut in half.
  fs::create_directories(dir / "cut");
  write_text(dir / "cut/tokenizer.json", good.substr(0, good.size() / 2));
  expect_one_error(tokenize(dir / "cut/tokenizer.json", dir / "in.txt"),
                   {dir / "cut/tokenizer.json", "not valid JSON"});
  // The directory form finds the same file.
  expect_one_error(tokenize(dir / "cut", dir / "in.txt"),
                   {dir / "cut/tokenizer.json", "not valid JSON"});
  // Foreign bytes named tokenizer.model: a PNG, a JSON text.
  fs::create_directories(dir / "png");
  static const char png[] = "\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0";
  write_text(dir / "png/tokenizer.model", std::string(png, sizeof(png) - 1));
  expect_one_error(tokenize(dir / "png/tokenizer.model", dir / "in.txt"),
                   {dir / "png/tokenizer.model", "not a SentencePiece model"});
  write_text(dir / "json.model", good);
  expect_one_error(tokenize(dir / "json.model", dir / "in.txt"),
                   {dir / "json.model", "not a SentencePiece model"});
  // Models, normalizers and pre-tokenizers bottle does not implement, by name.
  json wordpiece = byte_level_json();
  wordpiece["model"] = {{"type", "WordPiece"},
                        {"unk_token", "[UNK]"},
                        {"continuing_subword_prefix", "##"},
                        {"max_input_chars_per_word", 100},
                        {"vocab", {{"[UNK]", 0}, {"a", 1}}}};
  const std::string wp = write_json(dir, "wp/tokenizer.json", wordpiece);
  expect_one_error(tokenize(wp, dir / "in.txt"), {wp, "WordPiece", "not implemented"});
  json unigram = byte_level_json();
  unigram["model"] = {
      {"type", "Unigram"},
      {"unk_id", 0},
      {"vocab", json::array({json::array({"<unk>", 0.0}), json::array({"a", -1.5})})},
      {"byte_fallback", false}};
  const std::string ug = write_json(dir, "ug/tokenizer.json", unigram);
  expect_one_error(tokenize(ug, dir / "in.txt"), {ug, "Unigram", "not implemented"});
  json nfc = byte_level_json();
  nfc["normalizer"] = {{"type", "Sequence"}, {"normalizers", json::array({{{"type", "NFC"}}})}};
  const std::string nf = write_json(dir, "nfc/tokenizer.json", nfc);
  expect_one_error(tokenize(nf, dir / "in.txt"), {nf, "NFC", "not implemented"});
  // A rank file with a malformed line: FILE:LINE.
  std::string ranks = read_bytes(write_tiktoken(dir, "bad.tiktoken"));
  const size_t third = ranks.find('\n', ranks.find('\n') + 1) + 1;
  ranks.insert(third, "not-base64! 2\n");
  write_text(dir / "bad.tiktoken", ranks);
  expect_one_error(tokenize(dir / "bad.tiktoken", dir / "in.txt"),
                   {dir / "bad.tiktoken:3:", "not a tiktoken rank line"});
  // An extension that names no tokenizer kind; a path that does not exist.
  write_text(dir / "vocab.txt", "a 0\nb 1\n");
  expect_one_error(tokenize(dir / "vocab.txt", dir / "in.txt"),
                   {dir / "vocab.txt", "unknown tokenizer file"});
  expect_one_error(tokenize(dir / "missing.json", dir / "in.txt"), {dir / "missing.json"});
}

TEST(BadTokenizer, PrepareNamesTheJsonlLine) {
  TempDir dir;
  const std::string tok = write_json(dir, "tok/tokenizer.json", byte_level_json());
  // test_prepare covers a line without the field; here a line that is not JSON, under a
  // tokenizer and its encoding threads.
  write_text(
      dir / "bad.jsonl",
      "{\"text\": \"the first\"}\n{\"text\": \"the second\"}\n\n{\"text\": \"unterminated}\n");
  expect_one_error(run(fmt::format("{} prepare --input {} --output {} --tokenizer {} --threads 2 "
                                   "--val-fraction 0",
                                   bottle_binary(), dir / "bad.jsonl", dir / "out", tok)),
                   {dir / "bad.jsonl:4:", "invalid JSON"});
  EXPECT_FALSE(fs::exists(dir / "out/data_train_000000.bin"));
}

// ---------------------------------------------------------------------------------------
// The round trip: prepare with a tokenizer, train, eval, sample.

std::string sentences(int seed, int count) {
  return sentences_of({"the", "then", "aaa", "abc", "brown", "fox", "over", "lazy", "dog", "and",
                       "shade", "there", "tree", "near", "river", "\xc3\xa9t\xc3\xa9"},
                      seed, count);
}

// A tiny CoLA model on `data`'s shards; vocab_size as given.
void write_train_config(const std::string& path, int64_t vocab, const std::string& data,
                        const std::string& folder) {
  std::string model = kTinyColaModelToml;
  model.replace(model.find("vocab_size = 64"), 15, fmt::format("vocab_size = {}", vocab));
  std::ofstream(path) << model
                      << fmt::format(R"([training]
steps = 3
micro_batch_size = 2
seq_len = 16
seed = 7
eval_interval = 0

[optimizer]
lr = 1e-2

[lr_scheduler]
warmup_steps = 1

[data]
train = "{}/data_train_*.bin"

[checkpoint]
folder = "{}"
interval = 0
keep = 1
)",
                                     data, folder);
}

// The step directory the run left in `folder`.
std::string only_checkpoint(const std::string& folder) {
  std::string found;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.is_directory() && e.path().filename().string().starts_with("step_")) {
      EXPECT_TRUE(found.empty()) << found << " and " << e.path();
      found = e.path().string();
    }
  return found;
}

json eval_json(const std::string& checkpoint, const std::string& data, std::string* output) {
  const CommandResult r =
      run(fmt::format("{} eval --checkpoint {} --data '{}' --batch 2 --seq 16 --batches 4 --json",
                      bottle_binary(), checkpoint, data));
  *output = r.output;
  EXPECT_EQ(r.status, 0) << r.output;
  // The JSON object is the last line.
  if (r.status != 0 || r.output.size() < 2) return json();
  const size_t start = r.output.rfind('\n', r.output.size() - 2);
  return json::parse(r.output.substr(start == std::string::npos ? 0 : start + 1), nullptr, false);
}

// One tokenized data set and a model trained on it, shared by the tests below.
class RoundTrip : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = new TempDir;
    TempDir& dir = *dir_;
    tokenizer_ = write_json(dir, "tok/tokenizer.json", byte_level_json());
    std::string inputs;
    for (int d = 0; d < 6; ++d) {
      write_text(dir / fmt::format("d{}.txt", d), sentences(d, 120 + 10 * d));
      inputs += fmt::format(" {}", dir / fmt::format("d{}.txt", d));
    }
    // Six documents at f = 0.34: two for validation.
    const CommandResult p = run(fmt::format(
        "{} prepare --tokenizer {} --input{} --output {} --val-fraction 0.34 --no-progress",
        bottle_binary(), tokenizer_, inputs, dir / "data"));
    prepare_output_ = p.output;
    if (p.status != 0) return;
    write_train_config(dir / "train.toml", 272, dir / "data", dir / "run");
    const CommandResult t = run(fmt::format("{} train {}", bottle_binary(), dir / "train.toml"));
    train_output_ = t.output;
    if (t.status != 0) return;
    checkpoint_ = only_checkpoint(dir / "run");
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }

  void SetUp() override {
    ASSERT_TRUE(fs::exists(dir_->str() + "/data/data_train.json")) << prepare_output_;
    ASSERT_FALSE(checkpoint_.empty()) << train_output_;
  }

 protected:
  static TempDir* dir_;
  static std::string tokenizer_, checkpoint_, prepare_output_, train_output_;
};

TempDir* RoundTrip::dir_ = nullptr;
std::string RoundTrip::tokenizer_, RoundTrip::checkpoint_, RoundTrip::prepare_output_,
    RoundTrip::train_output_;

TEST_F(RoundTrip, TheTokenizerTravelsAndEvalGivesBitsPerByte) {
  const TempDir& dir = *dir_;
  // The shards begin with the delimiter (<|endoftext|>, no BOS), then the first document.
  const auto tokenizer = load_tokenizer(tokenizer_);
  const Ids train = read_token_shard(dir / "data/data_train_000000.bin");
  Ids first{261};
  tokenizer->encode(sentences(0, 120), first);
  ASSERT_GE(train.size(), first.size());
  EXPECT_EQ(Ids(train.begin(), train.begin() + std::ptrdiff_t(first.size())), first);
  // The tokenizer in the run's folder and in the checkpoint, as HF lays it out.
  for (const std::string& d : {dir / "run", checkpoint_}) {
    for (const char* f : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
      EXPECT_TRUE(fs::is_regular_file(fs::path(d) / f)) << d << " lacks " << f;
    const auto found = find_tokenizer(d);
    ASSERT_NE(found, nullptr) << d;
    expect_same_tokenizer(*tokenizer, *found);
  }
  // Bits per byte: loss / ln 2 / (bytes per token of the validation split).
  std::string output;
  const json j = eval_json(checkpoint_, dir / "data/data_val_*.bin", &output);
  ASSERT_TRUE(j.is_object()) << output;
  const double loss = j["loss"].get<double>();
  ASSERT_TRUE(j["bits_per_byte"].is_number()) << output;
  const double bpb = j["bits_per_byte"].get<double>();
  EXPECT_TRUE(std::isfinite(loss) && std::isfinite(bpb)) << output;
  const SplitMeta val = read_split_meta(dir / "data/data_val.json");
  EXPECT_EQ(val.documents, 2u);
  const double bytes_per_token = double(val.bytes) / double(val.tokens);
  EXPECT_GT(bytes_per_token, 1.0);  // the merges merged
  EXPECT_DOUBLE_EQ(bpb, loss / std::log(2.0) / bytes_per_token) << output;
}

TEST_F(RoundTrip, SamplePrintsThePromptAndDecodedText) {
  const std::string prompt = "the river \xc3\xa9t\xc3\xa9";
  const CommandResult r = run(
      fmt::format("{{ {} sample --checkpoint {} --prompt '{}' --tokens 24 --temperature 1 --seed 3 "
                  "2>/dev/null; }}",
                  bottle_binary(), checkpoint_, prompt));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(r.output.starts_with(prompt)) << r.output;
  ASSERT_TRUE(r.output.ends_with("\n")) << r.output;
  const std::string continuation =
      r.output.substr(prompt.size(), r.output.size() - prompt.size() - 1);
  EXPECT_FALSE(continuation.empty());
  EXPECT_TRUE(utf8_valid(r.output)) << r.output;
}

TEST_F(RoundTrip, TrainRefusesAVocabularySmallerThanTheTokenizers) {
  const TempDir& dir = *dir_;
  write_train_config(dir / "small.toml", 256, dir / "data", dir / "small_run");
  const CommandResult r = run(fmt::format("{} train {}", bottle_binary(), dir / "small.toml"));
  expect_one_error(r, {dir / "small.toml", "vocab_size = 256", "vocabulary of its tokenizer",
                       dir / "data/tokenizer/tokenizer.json"});
  EXPECT_FALSE(fs::exists(dir / "small_run/tokenizer.json"));
}

TEST_F(RoundTrip, CheckpointWhoseTokenizerExceedsItsConfigIsRefused) {
  const TempDir& dir = *dir_;
  const std::string copy = dir / "copy";
  fs::remove_all(copy);
  fs::copy(checkpoint_, copy, fs::copy_options::recursive);
  // A tokenizer with more ids (an added token at 400) than the model's 272 rows.
  json bigger = byte_level_json();
  bigger["added_tokens"].push_back(added_token(400, "<|big|>", true));
  write_text(copy + "/tokenizer.json", bigger.dump());
  ASSERT_EQ(load_tokenizer(copy)->vocab_size(), 401);
  expect_one_error(
      run(fmt::format("{} sample --checkpoint {} --prompt the --tokens 4", bottle_binary(), copy)),
      {copy + "/config.json", "vocab_size = 272"});
  expect_one_error(run(fmt::format("{} eval --checkpoint {} --data '{}' --batch 2 --seq 16",
                                   bottle_binary(), copy, dir / "data/data_val_*.bin")),
                   {copy + "/config.json", "vocab_size = 272"});
}

// eval takes a run's folder for its newest checkpoint and prepare's output directory for its
// validation split (never the two splits mixed), and refuses shards of another tokenizer.
TEST_F(RoundTrip, EvalFindsTheCheckpointAndTheSplitAndRefusesOtherTokens) {
  const TempDir& dir = *dir_;
  std::string named_output, found_output;
  const json named = eval_json(checkpoint_, dir / "data/data_val_*.bin", &named_output);
  const json found = eval_json(dir / "run", dir / "data", &found_output);
  EXPECT_EQ(found["loss"], named["loss"]) << found_output;
  EXPECT_NE(found_output.find(fmt::format("eval: {} is a run's folder: its newest checkpoint is {}",
                                          dir / "run", checkpoint_)),
            std::string::npos)
      << found_output;
  EXPECT_NE(found_output.find("evaluating the validation split " + dir / "data/data_val_*.bin"),
            std::string::npos)
      << found_output;
  // The same text as byte-level shards: the model's ids would mean other text.
  const CommandResult p =
      run(fmt::format("{} prepare --input {} --output {} --val-fraction 0 --no-progress",
                      bottle_binary(), dir / "d0.txt", dir / "bytes"));
  ASSERT_EQ(p.status, 0) << p.output;
  expect_one_error(
      run(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16", bottle_binary(),
                      checkpoint_, dir / "bytes")),
      {dir / "bytes/data_train.json", "byte-level", "bottle prepare --tokenizer " + checkpoint_});
}

// --num-samples draws one sample after another from one random stream; --top-p 0 keeps only
// the most likely token (greedy), and --top-p 1 changes nothing.
TEST_F(RoundTrip, SampleTopPAndSeveralSamples) {
  auto samples = [&](const std::string& options) {
    const CommandResult r =
        run(fmt::format("{} sample --checkpoint {} --prompt 'the river' --tokens 12 --json "
                        "--ignore-eos {} 2>/dev/null",
                        bottle_binary(), checkpoint_, options));
    EXPECT_EQ(r.status, 0) << r.output;
    std::vector<json> out;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) out.push_back(json::parse(line));
    return out;
  };
  const std::vector<json> greedy = samples("--temperature 0");
  ASSERT_EQ(greedy.size(), 1u);
  EXPECT_EQ(samples("--temperature 1 --top-p 0")[0]["ids"], greedy[0]["ids"]);
  const std::vector<json> three = samples("--temperature 1 --seed 5 --num-samples 3");
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(samples("--temperature 1 --seed 5")[0]["ids"], three[0]["ids"]);
  EXPECT_EQ(samples("--temperature 1 --seed 5 --top-p 1 --num-samples 3"), three);
  EXPECT_NE(three[0]["ids"], three[1]["ids"]);  // 12 tokens drawn at T = 1 from 272
  for (const json& j : three) EXPECT_EQ(j["stop"], "tokens");
  // In text, the samples follow one another, each after the prompt, "---" between them.
  const CommandResult text =
      run(fmt::format("{} sample --checkpoint {} --prompt 'the river' --tokens 6 --num-samples 2 "
                      "--seed 5 2>/dev/null",
                      bottle_binary(), checkpoint_));
  ASSERT_EQ(text.status, 0) << text.output;
  EXPECT_TRUE(text.output.starts_with("the river")) << text.output;
  EXPECT_NE(text.output.find("\n---\nthe river"), std::string::npos) << text.output;
  expect_one_error(run(fmt::format("{} sample --checkpoint {} --prompt a --top-p 1.5",
                                   bottle_binary(), checkpoint_)),
                   {"--top-p"});
}

// A model that learnt where documents end stops there: one-line documents (prepare
// --documents line), each after the delimiter <|endoftext|>, so "a\n" is followed by it.
TEST(SampleStops, AtTheEndOfADocument) {
  TempDir dir;
  const std::string tokenizer = write_json(dir, "tok/tokenizer.json", byte_level_json());
  std::string lines;
  for (int i = 0; i < 400; ++i) lines += "a\n";
  write_text(dir / "lines.txt", lines);
  const CommandResult p =
      run(fmt::format("{} prepare --tokenizer {} --input {} --output {} --documents line "
                      "--val-fraction 0 --no-progress",
                      bottle_binary(), tokenizer, dir / "lines.txt", dir / "data"));
  ASSERT_EQ(p.status, 0) << p.output;
  write_train_config(dir / "train.toml", 272, dir / "data", dir / "run");
  const CommandResult t =
      run(fmt::format("{} train {} --set training.steps=60", bottle_binary(), dir / "train.toml"));
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string checkpoint = only_checkpoint(dir / "run");
  const CommandResult r = run(fmt::format(
      "{} sample --checkpoint {} --prompt a --tokens 10 --temperature 0 --json 2>/dev/null",
      bottle_binary(), checkpoint));
  ASSERT_EQ(r.status, 0) << r.output;
  const json j = json::parse(r.output);
  EXPECT_EQ(j["stop"], "eos") << j;
  EXPECT_EQ(j["ids"].back(), 261) << j;  // the delimiter ends the sample, and is not its text
  EXPECT_EQ(j["text"], "\n") << j;
  const CommandResult text = run(
      fmt::format("{} sample --checkpoint {} --prompt a --tokens 10 --temperature 0 2>/dev/null",
                  bottle_binary(), checkpoint));
  EXPECT_EQ(text.output, "a\n\n") << text.output;
  const CommandResult on = run(fmt::format(
      "{} sample --checkpoint {} --prompt a --tokens 10 --temperature 0 --json --ignore-eos "
      "2>/dev/null",
      bottle_binary(), checkpoint));
  EXPECT_EQ(json::parse(on.output)["ids"].size(), 10u) << on.output;
}

// Issue 29, rule 7: a run's tokenizer must be the shards' (kind and vocabulary, as their
// description records), and a resume's the checkpoint's (the same ids for a probe text).
TEST(TokenizerChanges, AreRefusedByName) {
  TempDir dir;
  const std::string tokenizer = write_json(dir, "a/tokenizer.json", byte_level_json());
  std::string inputs;
  for (int d = 0; d < 3; ++d) {
    write_text(dir / fmt::format("d{}.txt", d), sentences(20 + d, 100));
    inputs += fmt::format(" {}", dir / fmt::format("d{}.txt", d));
  }
  const CommandResult p = run(
      fmt::format("{} prepare --tokenizer {} --input{} --output {} --val-fraction 0 --no-progress",
                  bottle_binary(), tokenizer, inputs, dir / "data"));
  ASSERT_EQ(p.status, 0) << p.output;
  write_train_config(dir / "train.toml", 272, dir / "data", dir / "run");
  ASSERT_EQ(run(fmt::format("{} train {}", bottle_binary(), dir / "train.toml")).status, 0);
  // The same kind and vocabulary without merges: other ids for the same text.
  json plain = byte_level_json();
  plain["model"]["merges"] = json::array();
  const std::string unmerged = write_json(dir, "b/tokenizer.json", plain);
  expect_one_error(
      run(fmt::format("{} train {} --resume --set training.steps=5 --set "
                      "data.tokenizer={}",
                      bottle_binary(), dir / "train.toml", unmerged)),
      {"--resume:", "holds the tokenizer", "data.tokenizer = " + unmerged, "--init-from"});
  // Another vocabulary than the shards were made with, on a fresh run and on a resume.
  json bigger = byte_level_json();
  bigger["added_tokens"].push_back(added_token(270, "<|big|>", true));
  const std::string other = write_json(dir, "c/tokenizer.json", bigger);
  for (const std::string& resume : {std::string(), std::string("--resume")})
    expect_one_error(
        run(fmt::format("{} train {} {} --set training.steps=5 --set data.tokenizer={} --set "
                        "checkpoint.folder={}",
                        bottle_binary(), dir / "train.toml", resume, other,
                        dir / (resume.empty() ? "fresh" : "run"))),
        {"data.tokenizer = " + other, dir / "data/data_train.json",
         "says the shards of data.train were made with"});
}

TEST(ByteLevelRoundTrip, BitsPerByteIsLossOverLn2) {
  TempDir dir;
  std::string inputs;
  for (int d = 0; d < 4; ++d) {
    write_text(dir / fmt::format("d{}.txt", d), sentences(10 + d, 80));
    inputs += fmt::format(" {}", dir / fmt::format("d{}.txt", d));
  }
  const CommandResult p =
      run(fmt::format("{} prepare --input{} --output {} --val-fraction 0.25 --no-progress",
                      bottle_binary(), inputs, dir / "data"));
  ASSERT_EQ(p.status, 0) << p.output;
  write_train_config(dir / "train.toml", 256, dir / "data", dir / "run");
  const CommandResult t = run(fmt::format("{} train {}", bottle_binary(), dir / "train.toml"));
  ASSERT_EQ(t.status, 0) << t.output;
  const std::string checkpoint = only_checkpoint(dir / "run");
  ASSERT_FALSE(checkpoint.empty());
  // Byte-level data carries bottle's byte tokenizer (its files let transformers read it).
  for (const std::string& where : {checkpoint, dir / "run"}) {
    const auto found = find_tokenizer(where);
    ASSERT_NE(found, nullptr) << where;
    EXPECT_EQ(found->kind(), "bytes") << where;
  }
  std::string output;
  const json j = eval_json(checkpoint, dir / "data/data_val_*.bin", &output);
  ASSERT_TRUE(j.is_object()) << output;
  ASSERT_TRUE(j["bits_per_byte"].is_number()) << output;
  EXPECT_EQ(j["bits_per_byte"].get<double>(), j["loss"].get<double>() / std::log(2.0)) << output;
}

// bench tokenize runs (its figures are for benchmarks, not tests): every thread count encodes
// the same tokens, and a thread count of 0 is refused.
TEST(BenchTokenize, ThreadCountsAgreeOnTheTokens) {
  TempDir dir;
  const std::string tokenizer = write_json(dir, "tokenizer.json", byte_level_json());
  std::ofstream(dir / "text.txt") << sentences(3, 2000);
  const CommandResult r =
      run(fmt::format("{} bench tokenize --tokenizer {} --input {} --threads 1,2,3 --repeat 2 "
                      "--peer none --json",
                      bottle_binary(), tokenizer, dir / "text.txt"));
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<json> rows;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) rows.push_back(json::parse(line));
  ASSERT_EQ(rows.size(), 3u) << r.output;
  for (const json& row : rows) {
    EXPECT_EQ(row["tokens"], rows[0]["tokens"]) << r.output;
    EXPECT_GT(row["mb_per_s"].get<double>(), 0.0);
  }
  // A line is a document: the count is the tokenizer's over the lines.
  const auto t = load_tokenizer(tokenizer);
  uint64_t expected = 0;
  std::istringstream text(sentences(3, 2000));
  for (std::string line; std::getline(text, line);)
    if (!line.empty()) expected += t->encode(line).size();
  EXPECT_EQ(rows[0]["tokens"].get<uint64_t>(), expected);
  const CommandResult zero =
      run(fmt::format("{} bench tokenize --tokenizer {} --input {} --threads 0 --peer none",
                      bottle_binary(), tokenizer, dir / "text.txt"));
  EXPECT_EQ(zero.status, 1) << zero.output;
}
}  // namespace
}  // namespace bottle::testing
