#include "data/split_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"

namespace bottle {

struct SplitPattern::Compiled {
  pcre2_code* code = nullptr;
  ~Compiled() { pcre2_code_free(code); }
};

namespace {

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};

}  // namespace

SplitPattern::SplitPattern(const std::string& pattern, const std::string& where)
    : pattern_(pattern), where_(where), compiled_(std::make_unique<Compiled>()) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  // UCP: \s, \d, \w and case folding by Unicode properties, as the Rust engines do. The input
  // is valid UTF-8 (the caller replaced the rest), so the match need not check it again.
  compiled_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                                  PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
  BOTTLE_CHECK(compiled_->code != nullptr,
               "{}: split pattern {:?} does not compile at offset {}: {}", where, pattern, offset,
               pcre2_message(error));
  // Without the JIT (a platform that lacks it) matching is slower but the same.
  pcre2_jit_compile(compiled_->code, PCRE2_JIT_COMPLETE);
}

SplitPattern::~SplitPattern() = default;
SplitPattern::SplitPattern(SplitPattern&&) noexcept = default;
SplitPattern& SplitPattern::operator=(SplitPattern&&) noexcept = default;

void SplitPattern::split(std::string_view text, bool keep_gaps,
                         std::vector<std::string_view>& pieces) const {
  thread_local std::unique_ptr<pcre2_match_data, MatchDataDeleter> match(
      pcre2_match_data_create(1, nullptr));
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t start = 0, gap = 0;
  while (start < text.size()) {
    const int rc = pcre2_match(compiled_->code, subject, text.size(), start, PCRE2_NO_UTF_CHECK,
                               match.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    BOTTLE_CHECK(rc >= 0, "{}: split pattern {:?}: matching failed at byte {} of a text of {}: {}",
                 where_, pattern_, start, text.size(), pcre2_message(rc));
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match.get());
    const size_t begin = ovector[0], end = ovector[1];
    if (end == begin) {
      // An empty match yields no piece; step over one whole character.
      start = begin + 1;
      while (start < text.size() && (static_cast<unsigned char>(text[start]) & 0xC0) == 0x80)
        ++start;
      continue;
    }
    if (keep_gaps && begin > gap) pieces.push_back(text.substr(gap, begin - gap));
    pieces.push_back(text.substr(begin, end - begin));
    start = gap = end;
  }
  if (keep_gaps && gap < text.size()) pieces.push_back(text.substr(gap));
}

}  // namespace bottle
