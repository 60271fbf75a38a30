#include "apps/cli_checks.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <cstdlib>

namespace bottle {

CLI::Validator integer_in(int64_t lo, int64_t hi) {
  const std::string range = hi == kNoLimit ? fmt::format("an integer >= {}", lo)
                                           : fmt::format("an integer in [{}, {}]", lo, hi);
  return CLI::Validator(
      [lo, hi, range](std::string& text) -> std::string {
        int64_t v = 0;
        const char* begin = text.data() + (text.starts_with('+') ? 1 : 0);
        const auto [end, ec] = std::from_chars(begin, text.data() + text.size(), v);
        if (text.empty() || ec != std::errc() || end != text.data() + text.size() || v < lo ||
            v > hi)
          return fmt::format("must be {}, got '{}'", range, text);
        return {};
      },
      range);
}

CLI::Validator finite_in(double lo, double hi, bool hi_open) {
  const std::string range =
      std::isinf(hi) ? fmt::format("a finite number >= {}", lo)
                     : fmt::format("a finite number in [{}, {}{}", lo, hi, hi_open ? ')' : ']');
  return CLI::Validator(
      [lo, hi, hi_open, range](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v) || v < lo ||
            (hi_open ? v >= hi : v > hi))
          return fmt::format("must be {}, got '{}'", range, text);
        return {};
      },
      range);
}

}  // namespace bottle
