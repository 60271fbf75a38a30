#include "apps/tokenizer_options.h"

#include <charconv>

#include "core/error.h"

namespace bottle {

void add_tokenizer_options(CLI::App& app, TokenizerOptions& o, bool required) {
  auto* path = app.add_option(
      "--tokenizer", o.path,
      "a SentencePiece .model, an HF tokenizer.json (BPE), a tiktoken .tiktoken rank file, or a "
      "directory holding one" +
          std::string(required ? "" : " (default: bottle's byte-level tokenizer)"));
  if (required) path->required();
  app.add_option("--tiktoken-pattern", o.tiktoken_pattern,
                 "a .tiktoken file's split pattern: gpt2, r50k_base, p50k_base, cl100k_base, "
                 "o200k_base or a regex (default cl100k_base)");
  app.add_option("--tiktoken-special", o.tiktoken_specials,
                 "a .tiktoken file's special token TEXT=ID, repeatable (default: <|endoftext|> "
                 "after the last rank)");
}

std::unique_ptr<Tokenizer> open_tokenizer(const TokenizerOptions& o) {
  const bool tiktoken_options = !o.tiktoken_pattern.empty() || !o.tiktoken_specials.empty();
  if (o.path.empty()) {
    BOTTLE_CHECK(!tiktoken_options, "--tiktoken-pattern / --tiktoken-special need --tokenizer");
    return make_byte_tokenizer();
  }
  if (!o.path.ends_with(".tiktoken")) {
    BOTTLE_CHECK(!tiktoken_options,
                 "--tiktoken-pattern / --tiktoken-special apply to a .tiktoken rank file, not to "
                 "{}",
                 o.path);
    return load_tokenizer(o.path);
  }
  TiktokenOptions options;
  if (!o.tiktoken_pattern.empty()) options.pattern = o.tiktoken_pattern;
  for (const std::string& s : o.tiktoken_specials) {
    const size_t eq = s.rfind('=');
    int32_t id = -1;
    const char* end = s.data() + s.size();
    BOTTLE_CHECK(eq != std::string::npos && eq > 0 &&
                     std::from_chars(s.data() + eq + 1, end, id).ptr == end && id >= 0,
                 "--tiktoken-special '{}': expected TEXT=ID with a non-negative id", s);
    options.special_tokens.emplace_back(s.substr(0, eq), id);
  }
  return load_tiktoken(o.path, options);
}

}  // namespace bottle
