#include "core/json_bounded.h"

#include "core/error.h"

namespace bottle {

nlohmann::json parse_json_bounded(std::string_view text, const std::string& source,
                                  size_t max_bytes, size_t max_depth) {
  BOTTLE_CHECK(text.size() <= max_bytes, "{}: JSON of {} bytes exceeds the limit of {} bytes",
               source, text.size(), max_bytes);
  // Brackets inside strings do not nest; a malformed text is left to the parser's message.
  size_t depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      BOTTLE_CHECK(++depth <= max_depth,
                   "{}: JSON nests deeper than {} levels (at byte {}); refusing it", source,
                   max_depth, i);
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON ({})", source, e.what());
  }
}

}  // namespace bottle
