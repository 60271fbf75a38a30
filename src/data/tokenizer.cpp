#include "data/tokenizer.h"

#include <fmt/format.h>

#include <fstream>
#include <iterator>

#include "io/atomic_output.h"
#include "core/error.h"
#include "io/json_io.h"
#include "data/bpe_merges.h"
#include "data/byte_tokenizer.h"
#include "data/tokenizer_files.h"

namespace bottle {

namespace {

using nlohmann::json;

// tokenizer_config.json's key that marks bottle's byte tokenizer.
constexpr const char* kBottleKindKey = "bottle_tokenizer";

// The file names save() writes, in the order a directory is searched.
constexpr const char* kTokenizerJson = "tokenizer.json";
constexpr const char* kSentencePieceModel = "tokenizer.model";
constexpr const char* kTiktokenRanks = "tokenizer.tiktoken";

class ByteTokenizer final : public Tokenizer {
 public:
  std::string_view kind() const override { return "bytes"; }
  std::string describe() const override {
    return fmt::format("byte-level, vocabulary {} (token = byte value)", kByteVocabSize);
  }
  int64_t vocab_size() const override { return kByteVocabSize; }
  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    for (char c : text) out.push_back(static_cast<unsigned char>(c));
  }
  std::string decode(std::span<const int32_t> ids) const override { return byte_decode(ids); }
  // For transformers, a tokenizer.json with the same ids: ByteLevel without its regex maps
  // each byte to one character, and a BPE without merges maps that character to the byte's
  // value. tokenizer_config.json marks it, so that bottle reads it back as bytes.
  void save(const fs::path& dir) const override {
    const auto& chars = byte_level_chars();
    json vocab = json::object();
    for (int b = 0; b < kByteVocabSize; ++b) vocab[chars[size_t(b)]] = b;
    const json tokenizer = byte_level_bpe_json(vocab, json::array(), false, nullptr, json::array());
    write_file_atomically(dir / kTokenizerJson, tokenizer.dump() + "\n");
    write_hf_tokenizer_config(dir, "PreTrainedTokenizerFast", {}, {{kBottleKindKey, "bytes"}});
  }
};

std::optional<std::string> name_of(const json& config, const char* key) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return std::nullopt;
}

bool ends_with(const fs::path& path, std::string_view suffix) {
  return path.filename().string().ends_with(suffix);
}

}  // namespace

std::string read_file_bytes(const fs::path& path, const std::string& what, uint64_t max_bytes) {
  return read_bounded_file(path.string(), what, max_bytes);
}

json byte_level_bpe_json(json vocab, json merges, bool ignore_merges, const json& split,
                         json added_tokens) {
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}};
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", std::move(added_tokens)},
          {"normalizer", nullptr},
          {"pre_tokenizer",
           split.is_null()
               ? byte_level
               : json{{"type", "Sequence"}, {"pretokenizers", json::array({split, byte_level})}}},
          {"post_processor", nullptr},
          {"decoder", byte_level},
          {"model",
           {{"type", "BPE"},
            {"dropout", nullptr},
            {"unk_token", nullptr},
            {"continuing_subword_prefix", nullptr},
            {"end_of_word_suffix", nullptr},
            {"fuse_unk", false},
            {"byte_fallback", false},
            {"ignore_merges", ignore_merges},
            {"vocab", std::move(vocab)},
            {"merges", std::move(merges)}}}};
}

SpecialTokenNames read_special_token_names(const fs::path& dir) {
  const fs::path file = dir / "tokenizer_config.json";
  if (!fs::exists(file)) return {};
  const json config = read_json_file(file.string());
  BOTTLE_CHECK(config.is_object(), "{}: not a JSON object", file.string());
  return {name_of(config, "bos_token"), name_of(config, "eos_token"), name_of(config, "unk_token")};
}

void write_hf_tokenizer_config(const fs::path& dir, const std::string& tokenizer_class,
                               const SpecialTokenNames& names, const json& extra) {
  json config = {{"tokenizer_class", tokenizer_class}};
  json special = json::object();
  for (const auto& [key, name] :
       {std::pair{"bos_token", names.bos}, std::pair{"eos_token", names.eos},
        std::pair{"unk_token", names.unk}}) {
    config[key] = name ? json(*name) : json();
    if (name) special[key] = *name;
  }
  if (names.eos) {
    config["pad_token"] = *names.eos;
    special["pad_token"] = *names.eos;
  }
  config["model_input_names"] = {"input_ids", "attention_mask"};
  config.update(extra);
  write_file_atomically(dir / "tokenizer_config.json", config.dump(2) + "\n");
  write_file_atomically(dir / "special_tokens_map.json", special.dump(2) + "\n");
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> find_tokenizer(const fs::path& dir) {
  // exists, not is_regular_file: a FIFO or device under that name is refused by name when read
  // (without blocking), rather than passed over as if absent.
  std::error_code ec;
  if (const fs::path config = dir / "tokenizer_config.json"; fs::exists(config, ec)) {
    const json j = read_json_file(config.string());
    if (j.is_object() && j.contains(kBottleKindKey)) {
      BOTTLE_CHECK(j[kBottleKindKey] == "bytes", "{}: key '{}' is {}; bottle writes only \"bytes\"",
                   config.string(), kBottleKindKey, j[kBottleKindKey].dump());
      return make_byte_tokenizer();
    }
  }
  // A tiktoken tokenizer carries a tokenizer.json for transformers; bottle reads its ranks.
  if (fs::is_regular_file(dir / kTiktokenRanks))
    return load_tiktoken(dir / kTiktokenRanks, read_tiktoken_options(dir));
  if (fs::is_regular_file(dir / kTokenizerJson))
    return make_hf_bpe_tokenizer(dir / kTokenizerJson, read_special_token_names(dir));
  if (fs::is_regular_file(dir / kSentencePieceModel))
    return make_sentencepiece_tokenizer(dir / kSentencePieceModel);
  return nullptr;
}

std::unique_ptr<Tokenizer> load_tokenizer(const fs::path& path) {
  if (fs::is_directory(path)) {
    auto tokenizer = find_tokenizer(path);
    BOTTLE_CHECK(tokenizer, "{}: no tokenizer in this directory (expected {}, {} or {})",
                 path.string(), kTokenizerJson, kSentencePieceModel, kTiktokenRanks);
    return tokenizer;
  }
  BOTTLE_CHECK(fs::exists(path), "{}: no such tokenizer file", path.string());
  if (ends_with(path, ".json"))
    return make_hf_bpe_tokenizer(path, read_special_token_names(path.parent_path()));
  if (ends_with(path, ".model")) return make_sentencepiece_tokenizer(path);
  if (ends_with(path, ".tiktoken")) return load_tiktoken(path, TiktokenOptions{});
  fail(
      "{}: unknown tokenizer file: expected a SentencePiece .model, an HF tokenizer.json or a "
      "tiktoken .tiktoken rank file",
      path.string());
}

}  // namespace bottle
