#pragma once
// JSON read from a user's file: nlohmann::json keeps the last of two equal keys without a
// word, so that a file saying "hidden_size" twice (or naming a tensor twice) would be read
// as whichever came last. parse_json_file_text refuses such a document instead.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace bottle {

// Parses `text`, throwing nlohmann::json::exception when it is not JSON; `duplicate` gets
// the first key an object holds twice as a dotted path ("a.b"), or "" when there is none.
nlohmann::json parse_json_noting_duplicates(std::string_view text, std::string& duplicate);
// Parses `text`; throws bottle::Error naming `source` when it is not JSON or when an object
// holds a key twice (the message names the key and where it is, e.g. "a.b").
nlohmann::json parse_json_text(std::string_view text, const std::string& source);
// Reads the whole file `path` and parses it as above; errors name `path`.
nlohmann::json read_json_file(const std::string& path);

}  // namespace bottle
