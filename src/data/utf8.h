#pragma once
// UTF-8 as the reference tokenizers see it: they take Unicode strings, so bytes that are not
// valid UTF-8 become U+FFFD first, exactly as Python's bytes.decode("utf-8", "replace") does
// (one U+FFFD per maximal subpart of an ill-formed sequence, Unicode §3.9).
#include <cstddef>
#include <string>
#include <string_view>

namespace bottle {

// `text` with every ill-formed sequence replaced by U+FFFD (EF BF BD); valid input comes back
// unchanged.
std::string utf8_replace_invalid(std::string_view text);
// Whether `text` is valid UTF-8 (no surrogates, no overlongs, nothing above U+10FFFF).
bool utf8_valid(std::string_view text);
// Why `text` cannot serve as a path or a name that travels into JSON, a gnuplot script and
// one-line messages: "" when it can, else e.g. "byte 0xff at offset 12, which is not UTF-8" or
// "a line break at offset 5" (any control character: a byte below 0x20 or 0x7f).
std::string text_value_problem(std::string_view text);
// The length of the longest prefix of `text` that does not end inside a sequence that more
// bytes could still complete: what a streaming decoder may print now.
size_t utf8_complete_prefix(std::string_view text);

}  // namespace bottle
