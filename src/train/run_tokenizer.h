#pragma once
// The tokenizer that travels with a model: found for a training run, checked against the
// model's vocabulary, and read back from a checkpoint.
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/config.h"

namespace bottle {

// The run's tokenizer: data.tokenizer when set (`config_path` names it in errors), else the one
// `bottle prepare` saved beside the first training shard (DIR/tokenizer), else nullptr
// (byte-level data: nothing to carry). Refuses one whose vocabulary exceeds model.vocab_size.
std::unique_ptr<Tokenizer> find_run_tokenizer(const std::string& tokenizer_key,
                                              const std::vector<std::string>& train_files,
                                              int64_t vocab_size, const std::string& config_path);

// The tokenizer saved in the model directory `dir`, or nullptr when it holds none; refuses one
// whose vocabulary exceeds `config`'s vocab_size (the checkpoint disagrees with itself).
std::unique_ptr<Tokenizer> checkpoint_tokenizer(const std::string& dir, const ModelConfig& config);

// The ids config.json records for transformers (none for byte-level data: `tokenizer` null).
SpecialTokenIds special_token_ids(const Tokenizer* tokenizer);

// Refuses `tokenizer` when its vocabulary exceeds `vocab_size`; `what` says whose it is.
void check_tokenizer_fits(const Tokenizer& tokenizer, int64_t vocab_size, const std::string& what);

}  // namespace bottle
