#pragma once
// The options that name a tokenizer, the same on prepare, tokenize and bench tokenize:
// --tokenizer PATH, and for a tiktoken rank file its pattern and special tokens.
#include <CLI/CLI.hpp>
#include <memory>
#include <string>
#include <vector>

#include "data/tokenizer.h"

namespace bottle {

struct TokenizerOptions {
  std::string path;  // "" = bottle's byte-level tokenizer
  std::string tiktoken_pattern;
  std::vector<std::string> tiktoken_specials;  // "TEXT=ID"
};

void add_tokenizer_options(CLI::App& app, TokenizerOptions& options, bool required);
// The tokenizer the options name; the tiktoken options on another kind are refused.
std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerOptions& options);

}  // namespace bottle
