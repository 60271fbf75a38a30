#include "train/metrics.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/arena.h"
#include "core/error.h"
#include "io/file_read.h"
#include "sys/system_info.h"

namespace bottle {

namespace {

// 83 s as "1:23", 4000 s as "1:06:40".
std::string clock_time(double seconds) {
  const auto s = int64_t(std::max(0.0, seconds) + 0.5);
  return s >= 3600 ? fmt::format("{}:{:02d}:{:02d}", s / 3600, s / 60 % 60, s % 60)
                   : fmt::format("{}:{:02d}", s / 60, s % 60);
}

// 12345678 tokens as "12.35M", 1234 as "1.2k".
std::string token_count(double tokens) {
  if (tokens >= 1e9) return fmt::format("{:.2f}B", tokens / 1e9);
  if (tokens >= 1e6) return fmt::format("{:.2f}M", tokens / 1e6);
  if (tokens >= 1e3) return fmt::format("{:.1f}k", tokens / 1e3);
  return fmt::format("{:.0f}", tokens);
}

}  // namespace

MetricsLogger::MetricsLogger(const std::string& jsonl_path, int64_t log_freq, int64_t total_steps,
                             int64_t first_step, bool resumed, const std::string& tensorboard_dir,
                             const std::vector<std::string>& saved_lines)
    : path_(jsonl_path),
      log_freq_(log_freq),
      total_steps_(total_steps),
      first_step_(first_step),
      tty_(::isatty(STDOUT_FILENO) && !launched_by_mpirun()) {
  namespace fs = std::filesystem;
  // A device or FIFO (/dev/full, /dev/zero) would never end when read back on resume or
  // for the plot, and is no record of the run.
  std::error_code ec;
  BOTTLE_CHECK(!fs::exists(path_, ec) || fs::is_regular_file(path_, ec),
               "{}: metrics.jsonl must be a regular file (not a device, FIFO or directory)", path_);
  if (!fs::path(path_).parent_path().empty()) fs::create_directories(fs::path(path_).parent_path());
  std::vector<std::string> kept;
  if (resumed) {
    if (fs::exists(path_, ec))
      for_each_bounded_line(
          path_, "metrics.jsonl", kMaxJsonLinesFileBytes, kMaxJsonLineBytes,
          [&](std::string_view line, int64_t) {
            const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
            if (!j.is_discarded() && j.contains("step") && j["step"].is_number_integer() &&
                j["step"].get<int64_t>() <= first_step)
              kept.emplace_back(line);
          });
    // The resumed step's lines that a full disk cut (or that were never written): from the
    // checkpoint.
    for (const std::string& line : saved_lines)
      if (std::find(kept.begin(), kept.end(), line) == kept.end()) kept.push_back(line);
  }
  out_.open(path_, std::ios::trunc);
  BOTTLE_CHECK(out_, "{}: cannot open for writing (metrics.jsonl)", path_);
  for (const std::string& line : kept) out_ << line << "\n";
  out_.flush();
  BOTTLE_CHECK(out_, "{}: write failed (metrics.jsonl): {}", path_, std::strerror(errno));
  if (!tensorboard_dir.empty())
    tensorboard_ = std::make_unique<TensorBoardWriter>(tensorboard_dir, first_step);
}

std::string MetricsLogger::describe_write_error() const {
  if (!write_error_.empty())
    return fmt::format("{}: cannot write metrics.jsonl ({})", path_, write_error_);
  if (tensorboard_ && !tensorboard_->write_error().empty())
    return fmt::format("{}: cannot write the TensorBoard event file (metrics.tensorboard) ({})",
                       tensorboard_->path(), tensorboard_->write_error());
  return "";
}

void MetricsLogger::write_line(const std::string& line) {
  step_lines_.push_back(line);
  if (!write_error_.empty()) return;
  errno = 0;
  out_ << line << "\n";
  out_.flush();
  if (!out_) write_error_ = errno ? std::strerror(errno) : "write failed";
}

MetricsLogger::~MetricsLogger() { end_progress_line(); }

void MetricsLogger::end_progress_line() {
  if (progress_open_) fmt::print("\n");
  progress_open_ = false;
  std::fflush(stdout);
}

void MetricsLogger::log_step(const nlohmann::json& row) {
  step_lines_.clear();
  write_line(row.dump());
  const int64_t step = row["step"].get<int64_t>();
  if (tensorboard_) {
    for (const char* name : {"loss", "lr", "grad_norm", "tokens_per_s", "mfu"})
      if (row[name].is_number())
        tensorboard_->scalar(fmt::format("train/{}", name), step, row[name]);
  }
  const double ms = row["ms"].get<double>();
  elapsed_ms_ += ms;
  interval_ms_ += ms;
  interval_token_ms_ += row["tokens_per_s"].get<double>() * ms;
  if (row["mfu"].is_number())
    interval_mfu_ms_ += row["mfu"].get<double>() * ms;
  else
    interval_mfu_known_ = false;
  const double eta_s = elapsed_ms_ / double(step - first_step_) * double(total_steps_ - step) / 1e3;
  const std::string mfu = interval_mfu_known_
                              ? fmt::format("{:.1f}%", 100.0 * interval_mfu_ms_ / interval_ms_)
                              : std::string("n/a");
  const std::string line = fmt::format(
      "step {:>6}/{} | loss {:.4f} | lr {:.2e} | grad norm {:.3f} | {:.0f} tok/s | MFU {} | "
      "tokens {} | epoch {} | {} elapsed, ETA {} | peak {}",
      step, total_steps_, row["loss"].get<double>(), row["lr"].get<double>(),
      row["grad_norm"].get<double>(), interval_token_ms_ / interval_ms_, mfu,
      token_count(row["tokens_seen"].get<double>()), row["epoch"].get<int64_t>() + 1,
      clock_time(elapsed_ms_ / 1e3), clock_time(eta_s),
      format_bytes(row["peak_bytes"].get<size_t>()));
  const bool printed_line = step % log_freq_ == 0 || step == total_steps_;
  if (tty_) {
    fmt::print("\r{}\033[K", line);
    progress_open_ = true;
    if (printed_line) end_progress_line();
  } else if (printed_line) {
    fmt::print("{}\n", line);
  }
  if (printed_line) {
    interval_ms_ = interval_token_ms_ = interval_mfu_ms_ = 0.0;
    interval_mfu_known_ = true;
  }
  std::fflush(stdout);
}

void MetricsLogger::log_eval(int64_t step, double val_loss) {
  write_line(nlohmann::json{{"step", step}, {"val_loss", val_loss}}.dump());
  if (tensorboard_) tensorboard_->scalar("val/loss", step, val_loss);
  message(fmt::format("step {:>6}/{} | val loss {:.4f}", step, total_steps_, val_loss));
}

void MetricsLogger::message(const std::string& text) {
  end_progress_line();
  fmt::print("{}\n", text);
  std::fflush(stdout);
}

}  // namespace bottle
