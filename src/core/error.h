#pragma once
// Two kinds of failure, one exception type:
//   BOTTLE_CHECK   for what a user can get wrong (bad shapes, files, keys, flags): the message
//                  names the file, key or tensor, in words the user can act on.
//   BOTTLE_ASSERT  for an internal invariant, which only a bug breaks: the message starts
//                  with "internal error at FILE:LINE:", as llm.c's cudaCheck and ggml's
//                  GGML_ASSERT say where.
// Both throw bottle::Error (an assertion its subclass InternalError), so the one error path
// of apps/main.cpp reports either on every rank; it exits 1 for a user's error and 2 for an
// internal one.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>
#include <string_view>

namespace bottle {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// A number as messages print it: a NaN as "nan", without the sign bit the CPU happened to give
// it (x86's default NaN is negative, and whether a kernel's NaN is the default one depends on
// its instruction set), so that a message reads alike on every machine.
inline std::string message_number(double v) {
  return std::isnan(v) ? std::string("nan") : fmt::format("{}", v);
}

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> format, Args&&... args) {
  throw Error(fmt::format(format, std::forward<Args>(args)...));
}

// A source file's path from the repository's src/ or tests/ on: the build passes __FILE__
// as an absolute path, which says more about the machine than about the code.
constexpr std::string_view source_path(std::string_view file) {
  const size_t src = file.rfind("/src/"), tests = file.rfind("/tests/");
  const size_t at = src == std::string_view::npos     ? tests
                    : tests == std::string_view::npos ? src
                                                      : std::max(src, tests);
  return at == std::string_view::npos ? file : file.substr(at + 1);
}

// A broken internal invariant: what() is "internal error at FILE:LINE: message".
class InternalError : public Error {
 public:
  InternalError(std::string_view file, int line, const std::string& message)
      : Error(fmt::format("internal error at {}:{}: {}", source_path(file), line, message)),
        where_(fmt::format("{}:{}", source_path(file), line)),
        message_(message) {}
  const std::string& where() const { return where_; }      // FILE:LINE
  const std::string& message() const { return message_; }  // without the location

 private:
  std::string where_, message_;
};

template <typename... Args>
[[noreturn]] void fail_internal(const char* file, int line, fmt::format_string<Args...> format,
                                Args&&... args) {
  throw InternalError(file, line, fmt::format(format, std::forward<Args>(args)...));
}

}  // namespace bottle

// Checks a user-facing condition; the message says what is wrong and where.
#define BOTTLE_CHECK(cond, ...)    \
  do {                             \
    if (!(cond)) {                 \
      ::bottle::fail(__VA_ARGS__); \
    }                              \
  } while (0)

// Checks an internal invariant; the message says what broke, the macro where.
#define BOTTLE_ASSERT(cond, ...)                                \
  do {                                                          \
    if (!(cond)) {                                              \
      ::bottle::fail_internal(__FILE__, __LINE__, __VA_ARGS__); \
    }                                                           \
  } while (0)
