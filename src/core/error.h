#pragma once
// One error type for everything a user can get wrong (bad shapes, files, keys): the
// message names the file, key or tensor; apps print it once and exit non-zero.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace bottle {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace bottle

// Checks a user-facing condition; the message says what is wrong and where.
#define BOTTLE_CHECK(cond, ...)    \
  do {                             \
    if (!(cond)) {                 \
      ::bottle::fail(__VA_ARGS__); \
    }                              \
  } while (0)
