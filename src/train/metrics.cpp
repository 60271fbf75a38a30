#include "train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/arena.h"
#include "core/error.h"

namespace bottle {

MetricsLogger::MetricsLogger(const std::string& jsonl_path, int64_t log_freq, int64_t total_steps,
                             int64_t first_step, bool resumed)
    : path_(jsonl_path),
      log_freq_(log_freq),
      total_steps_(total_steps),
      first_step_(first_step),
      tty_(::isatty(STDOUT_FILENO)) {
  namespace fs = std::filesystem;
  // A device or FIFO (/dev/full, /dev/zero) would never end when read back on resume or
  // for the plot, and is no record of the run.
  std::error_code ec;
  BOTTLE_CHECK(!fs::exists(path_, ec) || fs::is_regular_file(path_, ec),
               "{}: metrics.jsonl must be a regular file (not a device, FIFO or directory)", path_);
  if (!fs::path(path_).parent_path().empty()) fs::create_directories(fs::path(path_).parent_path());
  std::vector<std::string> kept;
  if (resumed) {
    std::ifstream in(path_);
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.contains("step") && j["step"].get<int64_t>() <= first_step)
        kept.push_back(line);
    }
  }
  out_.open(path_, std::ios::trunc);
  BOTTLE_CHECK(out_, "{}: cannot open for writing (metrics.jsonl)", path_);
  for (const std::string& line : kept) out_ << line << "\n";
  out_.flush();
  BOTTLE_CHECK(out_, "{}: write failed (metrics.jsonl): {}", path_, std::strerror(errno));
}

void MetricsLogger::write_line(const std::string& line) {
  if (!write_error_.empty()) return;
  errno = 0;
  out_ << line << "\n";
  out_.flush();
  if (!out_) write_error_ = errno ? std::strerror(errno) : "write failed";
}

MetricsLogger::~MetricsLogger() { end_progress_line(); }

void MetricsLogger::end_progress_line() {
  if (progress_open_) std::printf("\n");
  progress_open_ = false;
  std::fflush(stdout);
}

void MetricsLogger::log_step(const nlohmann::json& row) {
  write_line(row.dump());
  const int64_t step = row["step"].get<int64_t>();
  elapsed_ms_ += row["ms"].get<double>();
  const double eta_s = elapsed_ms_ / double(step - first_step_) * double(total_steps_ - step) / 1e3;
  const std::string line = fmt::format(
      "step {:>6}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | MFU {} | peak "
      "{}",
      step, total_steps_, row["loss"].get<double>(), row["lr"].get<double>(),
      row["grad_norm"].get<double>(), row["tokens_per_s"].get<double>(),
      row["mfu"].is_number() ? fmt::format("{:.1f}%", 100.0 * row["mfu"].get<double>()) : "n/a",
      format_bytes(row["peak_bytes"].get<size_t>()));
  if (tty_) {
    std::printf("\r%s | ETA %.0fs\033[K", line.c_str(), eta_s);
    progress_open_ = true;
    if (step % log_freq_ == 0 || step == total_steps_) end_progress_line();
  } else if (step % log_freq_ == 0 || step == total_steps_) {
    std::printf("%s\n", line.c_str());
  }
  std::fflush(stdout);
}

void MetricsLogger::log_eval(int64_t step, double val_loss) {
  write_line(nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump());
  message(fmt::format("step {:>6}/{} | val loss {:.4f}", step, total_steps_, val_loss));
}

void MetricsLogger::message(const std::string& text) {
  end_progress_line();
  std::printf("%s\n", text.c_str());
  std::fflush(stdout);
}

}  // namespace bottle
