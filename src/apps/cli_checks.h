#pragma once
// CLI11 validators for every command's options, so that a nonsensical value is refused with
// one sentence naming the option and its allowed range (CLI::PositiveNumber's message prints
// the limits of a double; NonNegativeNumber lets NaN through), never replaced by a default.
#include <CLI/CLI.hpp>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

namespace bottle {

inline constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();
// The most OpenMP threads an option accepts: far above any machine, far below a typo.
inline constexpr int64_t kMaxThreads = 4096;

// A whole number in [lo, hi] (hi = kNoLimit: no upper bound).
CLI::Validator integer_in(int64_t lo, int64_t hi = kNoLimit);
// A finite number in [lo, hi]; `hi_open`: hi itself excluded.
CLI::Validator finite_in(double lo, double hi = std::numeric_limits<double>::infinity(),
                         bool hi_open = false);

// A path a command writes to: UTF-8 text without control characters (a line break would split
// the messages, JSON and scripts that name it), refused where it enters rather than after the
// work.
CLI::Validator output_path();
// The same for an output file: besides, an existing path that is not a regular file (a device,
// a FIFO, a directory, a socket) is refused, since the output would be renamed over it.
CLI::Validator output_file();
// The same for an output directory: an existing path that is not a directory is refused.
CLI::Validator output_directory();

// The model directory of a command's --checkpoint: the directory given, or for a run's folder
// its newest checkpoint, which the first rank names on stderr ("eval: runs/tiny is a run's
// folder: its newest checkpoint is runs/tiny/step_00002000").
std::string checkpoint_option(const std::string& given, const std::string& command);

// "; did you mean 'train'?" for the name of `names` closest to `word` (at most two edits away,
// or one for a short word), else "".
std::string did_you_mean(const std::string& word, const std::vector<std::string>& names);

}  // namespace bottle
