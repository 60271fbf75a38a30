#pragma once
// JSON read from a user's file: nlohmann::json keeps the last of two equal keys without a
// word, so that a file saying "hidden_size" twice (or naming a tensor twice) would be read
// as whichever came last. parse_json_text refuses such a document instead.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace bottle {

inline constexpr size_t kMaxJsonDepth = 64;
inline constexpr size_t kMaxJsonBytes = size_t(100) << 20;

// Refuses, naming `source`, a text longer than `max_bytes` or nesting arrays and objects deeper
// than `max_depth`: a cheap scan before anything parses it, since code that walks a JSON tree
// (nlohmann's dump, a reader's recursion) exhausts the stack on a hostile file 100,000 deep.
void check_json_bounds(std::string_view text, const std::string& source,
                       size_t max_bytes = kMaxJsonBytes, size_t max_depth = kMaxJsonDepth);

// Parses `text`, throwing nlohmann::json::exception when it is not JSON; `duplicate` gets
// the first key an object holds twice as a dotted path ("a.b"), or "" when there is none.
nlohmann::json parse_json_noting_duplicates(std::string_view text, std::string& duplicate);
// Parses `text`; throws bottle::Error naming `source` when it is not JSON, is out of
// check_json_bounds, or when an object holds a key twice (the message names the key and
// where it is, e.g. "a.b").
nlohmann::json parse_json_text(std::string_view text, const std::string& source);
// Reads the whole file `path` (a regular file of at most kMaxJsonBytes, checked before the
// read) and parses it as above; errors name `path`.
nlohmann::json read_json_file(const std::string& path);

}  // namespace bottle
