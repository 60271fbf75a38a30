#include "apps/cli_checks.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "comm/communicator.h"
#include "data/utf8.h"
#include "io/atomic_output.h"
#include "train/checkpoint_store.h"

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

CLI::Validator output_path() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        if (const std::string why = text_value_problem(text); !why.empty())
          return fmt::format("holds {}; paths must be UTF-8 text without control characters",
                             why);
        return {};
      },
      "PATH");
}

namespace {

// output_path's rule, then `check` (io/atomic_output.h) on the path; its message, if any.
CLI::Validator checked_output(void (*check)(const std::string&, std::string_view),
                              std::string_view what) {
  return CLI::Validator(
      [check, what](std::string& text) -> std::string {
        if (std::string why = output_path()(text); !why.empty()) return why;
        try {
          check(text, what);
        } catch (const Error& e) {
          return e.what();
        }
        return {};
      },
      "PATH");
}

}  // namespace

CLI::Validator output_file() { return checked_output(check_output_file, "the output file"); }

CLI::Validator output_directory() {
  return checked_output(check_output_directory, "the output directory");
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

std::string did_you_mean(const std::string& word, const std::vector<std::string>& names) {
  // Levenshtein distance, with a transposition counted as one edit ("trian" -> "train").
  auto distance = [](const std::string& a, const std::string& b) {
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i)
      for (size_t j = 1; j <= b.size(); ++j) {
        d[i][j] = std::min(
            {d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
      }
    return d[a.size()][b.size()];
  };
  const size_t allowed = word.size() <= 4 ? 1 : 2;
  std::string best;
  size_t best_distance = allowed + 1;
  for (const std::string& name : names)
    if (const size_t dist = distance(word, name); dist < best_distance) {
      best = name;
      best_distance = dist;
    }
  return best.empty() ? std::string() : fmt::format("; did you mean '{}'?", best);
}

std::string checkpoint_option(const std::string& given, const std::string& command) {
  check_not_a_run_without_checkpoint(given);
  const std::string dir = model_directory(given);
  if (dir != given && world_communicator().rank() == 0)
    fmt::print(stderr, "{}: {} is a run's folder: its newest checkpoint is {}\n", command, given,
               dir);
  return dir;
}

}  // namespace bottle
