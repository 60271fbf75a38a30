// A SentencePiece model (BPE or unigram) through libsentencepiece, the library the model was
// trained with, so ids are the library's by construction; bottle adds the checks and the HF
// files that go beside it.
#include <fmt/format.h>
#include <sentencepiece_processor.h>

#include "io/atomic_output.h"
#include "core/error.h"
#include "data/tokenizer_files.h"

namespace bottle {

namespace {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const fs::path& path) : path_(path) {
    const std::string bytes = read_file_bytes(path);
    const auto status = processor_.LoadFromSerializedProto(bytes);
    BOTTLE_CHECK(status.ok(), "{}: not a SentencePiece model ({})", path.string(),
                 status.ToString());
    BOTTLE_CHECK(processor_.GetPieceSize() > 0, "{}: SentencePiece model has no pieces",
                 path.string());
  }

  std::string_view kind() const override { return "sentencepiece"; }
  std::string describe() const override {
    return fmt::format("SentencePiece, vocabulary {}, {}", vocab_size(), path_.string());
  }
  int64_t vocab_size() const override { return processor_.GetPieceSize(); }
  std::optional<int32_t> bos_id() const override { return id_or_none(processor_.bos_id()); }
  std::optional<int32_t> eos_id() const override { return id_or_none(processor_.eos_id()); }

  void encode(std::string_view text, std::vector<int32_t>& out) const override {
    std::vector<int> ids;
    const auto status = processor_.Encode(text, &ids);
    BOTTLE_CHECK(status.ok(), "{}: SentencePiece cannot encode the text: {}", path_.string(),
                 status.ToString());
    out.insert(out.end(), ids.begin(), ids.end());
  }

  std::string decode(std::span<const int32_t> ids) const override {
    for (int32_t id : ids)
      BOTTLE_CHECK(id >= 0 && id < vocab_size(), "token {} is not in the vocabulary of {} ({} ids)",
                   id, path_.string(), vocab_size());
    std::string text;
    const auto status = processor_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    BOTTLE_CHECK(status.ok(), "{}: SentencePiece cannot decode: {}", path_.string(),
                 status.ToString());
    return text;
  }

  void save(const fs::path& dir) const override {
    write_file_atomically(dir / "tokenizer.model", processor_.serialized_model_proto());
    SpecialTokenNames names;
    auto piece = [&](int id) -> std::optional<std::string> {
      if (id < 0) return std::nullopt;
      return processor_.IdToPiece(id);
    };
    names.bos = piece(processor_.bos_id());
    names.eos = piece(processor_.eos_id());
    names.unk = piece(processor_.unk_id());
    // LlamaTokenizer reads a SentencePiece model; legacy keeps its encoding the library's.
    write_hf_tokenizer_config(dir, "LlamaTokenizer", names,
                              {{"add_bos_token", bool(names.bos)},
                               {"add_eos_token", false},
                               {"legacy", true},
                               {"clean_up_tokenization_spaces", false}});
  }

 private:
  static std::optional<int32_t> id_or_none(int id) {
    return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
  }

  fs::path path_;
  sentencepiece::SentencePieceProcessor processor_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(const fs::path& path) {
  return std::make_unique<SentencePieceTokenizer>(path);
}

}  // namespace bottle
