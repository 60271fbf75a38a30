#include "data/utf8.h"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

namespace bottle {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";

// What decoding finds at one position: a well-formed sequence of `length` bytes, or an
// ill-formed maximal subpart of `length` bytes (at least 1) that becomes one U+FFFD.
// `truncated` marks a subpart cut short by the end of the text, which more bytes could
// still complete.
struct Step {
  size_t length;
  bool valid;
  bool truncated;
};

// Unicode Table 3-7: the lead byte fixes the length and the range of the second byte (the
// narrow ranges are what exclude overlongs, surrogates and code points above U+10FFFF); every
// later byte is 80..BF. A byte that breaks the pattern ends the maximal subpart before it.
Step step_at(const unsigned char* p, size_t n) {
  const unsigned char lead = p[0];
  if (lead < 0x80) return {1, true, false};
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 3;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 4;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return {1, false, false};  // a continuation byte, C0, C1 or F5..FF: never a lead
  }
  for (size_t i = 1; i < need; ++i) {
    if (i >= n) return {i, false, true};
    const unsigned char c = p[i];
    if (c < lo || c > hi) return {i, false, false};
    lo = 0x80;
    hi = 0xBF;
  }
  return {need, true, false};
}

// The first index at or after `i` whose byte is not ASCII, eight bytes at a time.
size_t skip_ascii(const unsigned char* p, size_t i, size_t n) {
  while (i + 8 <= n) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    if (word & 0x8080808080808080ull) break;
    i += 8;
  }
  while (i < n && p[i] < 0x80) ++i;
  return i;
}

}  // namespace

std::string utf8_replace_invalid(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  std::string out;
  bool replaced = false;
  size_t run_start = 0;  // start of the valid bytes not yet copied
  size_t i = 0;
  while (true) {
    i = skip_ascii(p, i, n);
    if (i >= n) break;
    const Step s = step_at(p + i, n - i);
    if (!s.valid) {
      if (!replaced) out.reserve(n + kReplacement.size());
      replaced = true;
      out.append(text.data() + run_start, i - run_start);
      out.append(kReplacement);
      run_start = i + s.length;
    }
    i += s.length;
  }
  if (!replaced) return std::string(text);
  out.append(text.data() + run_start, n - run_start);
  return out;
}

bool utf8_valid(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  for (size_t i = skip_ascii(p, 0, n); i < n; i = skip_ascii(p, i, n)) {
    const Step s = step_at(p + i, n - i);
    if (!s.valid) return false;
    i += s.length;
  }
  return true;
}

size_t utf8_complete_prefix(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const size_t n = text.size();
  // A sequence is at most 4 bytes, so one that more bytes could complete starts in the last 3.
  // A lead byte always starts a new step of the decoder (it is never a continuation), so
  // decoding from it here agrees with decoding the whole text.
  for (size_t i = n > 3 ? n - 3 : 0; i < n; ++i) {
    if (p[i] < 0xC2 || p[i] > 0xF4) continue;
    if (step_at(p + i, n - i).truncated) return i;
  }
  return n;
}

std::string text_value_problem(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == '\n' || c == '\r') return fmt::format("a line break at offset {}", i);
    if (c < 0x20 || c == 0x7f)
      return fmt::format("the control character 0x{:02x} at offset {}", c, i);
    // The sequence this lead byte starts, checked whole.
    const size_t length = c < 0x80         ? 1
                          : (c >> 5) == 6  ? 2
                          : (c >> 4) == 14 ? 3
                          : (c >> 3) == 30 ? 4
                                           : 0;
    if (length == 0 || i + length > text.size() || !utf8_valid(text.substr(i, length)))
      return fmt::format("byte 0x{:02x} at offset {}, which is not UTF-8", c, i);
    i += length;
  }
  return {};
}

}  // namespace bottle
