#include "io/json_io.h"

#include <fstream>
#include <set>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "io/file_read.h"

namespace bottle {

void check_json_bounds(std::string_view text, const std::string& source, size_t max_bytes,
                       size_t max_depth) {
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
}

nlohmann::json parse_json_noting_duplicates(std::string_view text, std::string& duplicate) {
  using json = nlohmann::json;
  // One frame per open object: the keys seen so far and the key being read.
  struct Frame {
    std::set<std::string> keys;
    std::string current;
  };
  std::vector<Frame> frames;
  duplicate.clear();
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      frames.emplace_back();
    } else if (event == json::parse_event_t::object_end && !frames.empty()) {
      frames.pop_back();
    } else if (event == json::parse_event_t::key && !frames.empty()) {
      std::string key = parsed.get<std::string>();
      if (!frames.back().keys.insert(key).second && duplicate.empty()) {
        for (size_t i = 0; i + 1 < frames.size(); ++i) duplicate += frames[i].current + ".";
        duplicate += key;
      }
      frames.back().current = std::move(key);
    }
    return true;
  };
  return json::parse(text.begin(), text.end(), callback);
}

nlohmann::json parse_json_text(std::string_view text, const std::string& source) {
  check_json_bounds(text, source);
  std::string duplicate;
  nlohmann::json j;
  try {
    j = parse_json_noting_duplicates(text, duplicate);
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not valid JSON: {}", source, e.what());
  }
  BOTTLE_CHECK(duplicate.empty(),
               "{}: key '{}' appears more than once (JSON readers disagree on which one counts)",
               source, duplicate);
  return j;
}

nlohmann::json read_json_file(const std::string& path) {
  // The type and size first: a FIFO, /dev/zero or a 3 GB file is refused before any read.
  return parse_json_text(read_bounded_file(path, "the JSON file", kMaxJsonBytes), path);
}

}  // namespace bottle
