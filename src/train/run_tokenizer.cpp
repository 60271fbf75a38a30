#include "train/run_tokenizer.h"

#include <filesystem>

#include "core/error.h"

namespace bottle {

namespace fs = std::filesystem;

void check_tokenizer_fits(const Tokenizer& tokenizer, int64_t vocab_size, const std::string& what) {
  BOTTLE_CHECK(tokenizer.vocab_size() <= vocab_size,
               "{}: vocab_size = {} is smaller than the vocabulary of its tokenizer ({}): every "
               "token id the tokenizer makes needs an embedding row",
               what, vocab_size, tokenizer.describe());
}

std::unique_ptr<Tokenizer> find_run_tokenizer(const std::string& tokenizer_key,
                                              const std::vector<std::string>& train_files,
                                              int64_t vocab_size, const std::string& config_path) {
  std::unique_ptr<Tokenizer> tokenizer;
  if (!tokenizer_key.empty()) {
    try {
      tokenizer = load_tokenizer(tokenizer_key);
    } catch (const Error& e) {
      fail("{}: data.tokenizer: {}", config_path, e.what());
    }
  } else if (!train_files.empty()) {
    const fs::path beside = fs::path(train_files.front()).parent_path() / "tokenizer";
    if (fs::is_directory(beside)) tokenizer = load_tokenizer(beside);
  }
  if (tokenizer) check_tokenizer_fits(*tokenizer, vocab_size, config_path + ": model");
  return tokenizer;
}

std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& dir, const ModelConfig& config) {
  std::unique_ptr<Tokenizer> tokenizer = find_tokenizer(dir);
  if (tokenizer) check_tokenizer_fits(*tokenizer, config.vocab_size, dir + "/config.json");
  return tokenizer;
}

SpecialTokenIds special_token_ids(const Tokenizer* tokenizer) {
  if (!tokenizer) return {};
  return {tokenizer->bos_id(), tokenizer->eos_id()};
}

}  // namespace bottle
