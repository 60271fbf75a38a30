#pragma once
// The regex that cuts text into pre-tokens before BPE (GPT-2's, LLaMA-3's, tiktoken's
// patterns), through PCRE2 with Unicode properties and its JIT. The reference libraries use
// Rust's fancy-regex / Oniguruma; the patterns they ship use only what PCRE2 reads the same
// way (\p{..} classes, possessive quantifiers, lookahead, (?i:..)).
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

class SplitPattern {
 public:
  // Errors quote the pattern and PCRE2's message, prefixed by `where` (a file and key).
  SplitPattern(const std::string& pattern, const std::string& where);
  ~SplitPattern();
  SplitPattern(SplitPattern&&) noexcept;
  SplitPattern& operator=(SplitPattern&&) noexcept;

  const std::string& pattern() const { return pattern_; }
  // Appends the pieces of `text` (valid UTF-8) to `pieces`: every match and, when
  // `keep_gaps`, the text between matches too (HF's Split with behavior "isolated"; tiktoken
  // keeps only the matches). Views into `text`. Thread-safe.
  void split(std::string_view text, bool keep_gaps, std::vector<std::string_view>& pieces) const;

 private:
  std::string pattern_;
  std::string where_;  // the file and key, for a failure while matching
  struct Compiled;
  std::unique_ptr<Compiled> compiled_;
};

// GPT-2's pattern (HF's ByteLevel pre-tokenizer with use_regex, tiktoken's r50k/p50k).
inline constexpr std::string_view kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

}  // namespace bottle
