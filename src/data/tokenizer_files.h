#pragma once
// Inside the data layer: the constructors of each tokenizer kind, and the Hugging Face files
// that sit beside a tokenizer in a model directory.
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "io/file_read.h"
#include "data/tokenizer.h"

namespace bottle {

namespace fs = std::filesystem;

// What tokenizer_config.json says of the special tokens (HF's keys), when it is present.
struct SpecialTokenNames {
  std::optional<std::string> bos, eos, unk;
};
// Reads bos_token / eos_token / unk_token (strings, or HF's {"content": ...} objects) from
// `dir`/tokenizer_config.json; all empty when there is no such file.
SpecialTokenNames read_special_token_names(const fs::path& dir);

// Writes tokenizer_config.json (with `extra` merged in) and special_tokens_map.json into
// `dir`, as transformers' save_pretrained does. The model takes input_ids and attention_mask
// only (no token_type_ids: `model.generate(**tokenizer(text, return_tensors="pt"))` works), and
// EOS pads where there is one (LLaMA's tokenizers have no pad token), so that batches pad.
void write_hf_tokenizer_config(const fs::path& dir, const std::string& tokenizer_class,
                               const SpecialTokenNames& names, const nlohmann::json& extra);
// A byte-level BPE tokenizer.json as HF tokenizers writes one (what bottle saves for
// transformers): `split` (a Split pre-tokenizer, or null for none) then ByteLevel without its
// own regex, no normalizer, ByteLevel decoding.
nlohmann::json byte_level_bpe_json(nlohmann::json vocab, nlohmann::json merges, bool ignore_merges,
                                   const nlohmann::json& split, nlohmann::json added_tokens);
// The most ids a tokenizer file may use (ids 0 .. this - 1): the tables by id are dense, and
// the largest vocabularies in use hold about a million ids.
inline constexpr int32_t kMaxTokenizerIds = int32_t(1) << 24;
// The whole file, a regular one of at most `max_bytes` (checked before the read, so that a FIFO
// or /dev/zero named as a tokenizer is refused at once); errors name it and `what` it is.
std::string read_file_bytes(const fs::path& path, const std::string& what = "the tokenizer file",
                            uint64_t max_bytes = kMaxTokenizerFileBytes);

std::unique_ptr<Tokenizer> make_hf_bpe_tokenizer(const fs::path& path,
                                                 const SpecialTokenNames& names);
std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const fs::path& path);
// The pattern and special tokens a saved tiktoken tokenizer keeps in `dir`/tokenizer_config.json
// (the defaults when it has none).
TiktokenOptions read_tiktoken_options(const fs::path& dir);

}  // namespace bottle
