#pragma once
// JSON from files a user hands bottle (checkpoint headers, config.json, trainer_state.json):
// parsed only after a cheap scan bounds its size and nesting, so that a hostile file gets an
// error instead of exhausting the stack in code that walks the tree recursively.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace bottle {

inline constexpr size_t kMaxJsonDepth = 64;
inline constexpr size_t kMaxJsonBytes = size_t(100) << 20;

// Parses `text`; every error (too large, too deep, not JSON) names `source`.
nlohmann::json parse_json_bounded(std::string_view text, const std::string& source,
                                  size_t max_bytes = kMaxJsonBytes,
                                  size_t max_depth = kMaxJsonDepth);

}  // namespace bottle
