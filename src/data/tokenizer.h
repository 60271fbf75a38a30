#pragma once
// A tokenizer: text ⇄ token ids, exact to its reference library. Kinds:
//   bytes          bottle's own byte-level vocabulary (256, token = byte value), lossless
//   sentencepiece  a SentencePiece .model, through libsentencepiece
//   bpe            an HF tokenizer.json with a BPE model: byte-level (GPT-2, LLaMA-3, Qwen
//                  style) or SentencePiece-style (LLaMA-2: Prepend/Replace "▁", byte fallback)
//   tiktoken       a tiktoken rank file with its split pattern and special tokens
// Anything else (a WordPiece or Unigram tokenizer.json, an NFC normalizer, ...) is refused by
// name, never approximated.
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // "bytes", "sentencepiece", "bpe" or "tiktoken".
  virtual std::string_view kind() const = 0;
  // A line for logs: kind, flavour, vocabulary and the file it came from.
  virtual std::string describe() const = 0;
  // One more than the largest id the tokenizer can produce (special tokens included): a
  // model's vocab_size must be at least this.
  virtual int64_t vocab_size() const = 0;
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int32_t> eos_id() const { return std::nullopt; }
  // The token that separates documents in a shard, placed before each one (llm.c's order):
  // BOS when the tokenizer has one (LLaMA), else EOS (GPT-2's <|endoftext|>); none for bytes.
  std::optional<int32_t> document_delimiter() const {
    const auto bos = bos_id();
    return bos ? bos : eos_id();
  }

  // Appends the ids of `text` to `out`. Ordinary text: a special token's string inside it is
  // encoded as text, never as the special token (what a corpus must get). Thread-safe.
  // Text tokenizers take valid UTF-8 (see utf8_replace_invalid); bytes takes anything.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> ids;
    encode(text, ids);
    return ids;
  }
  // The text of `ids`, as the reference library decodes them (special tokens kept). Errors
  // name an id outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;

  // Writes the tokenizer into `dir` as Hugging Face lays it out beside a model (tokenizer.json
  // or tokenizer.model, tokenizer_config.json, special_tokens_map.json; for tiktoken the rank
  // file, its options in tokenizer_config.json and the same tokenizer as a tokenizer.json,
  // which transformers reads; for bytes a tokenizer.json of the same ids, marked as bytes in
  // tokenizer_config.json).
  virtual void save(const std::filesystem::path& dir) const = 0;
};

// The tokenizer at `path`: a SentencePiece .model, a tokenizer.json, a .tiktoken file, or a
// directory holding one of them as save() writes it (bytes when tokenizer_config.json marks
// them; then tokenizer.tiktoken, whose tokenizer.json is there for transformers; then
// tokenizer.json, then tokenizer.model). Errors name
// the file and what is wrong in it.
std::unique_ptr<Tokenizer> load_tokenizer(const std::filesystem::path& path);
// The tokenizer saved in `dir` (a checkpoint or a prepared data directory), or nullptr when it
// holds none of the files.
std::unique_ptr<Tokenizer> find_tokenizer(const std::filesystem::path& dir);
// bottle's byte-level tokenizer.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// tiktoken has no file for its pattern and special tokens: these name them. `pattern` is a
// known encoding's name (gpt2 / r50k_base, p50k_base, cl100k_base, o200k_base) or a regex;
// `special_tokens` maps a string to its id; empty: "<|endoftext|>" after the last rank.
struct TiktokenOptions {
  std::string pattern = "cl100k_base";
  std::vector<std::pair<std::string, int32_t>> special_tokens;
};
std::unique_ptr<Tokenizer> load_tiktoken(const std::filesystem::path& path,
                                         const TiktokenOptions& options);

}  // namespace bottle
