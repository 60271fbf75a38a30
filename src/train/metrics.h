#pragma once
// Per-step metrics: one JSON object per step in metrics.jsonl, and a printed line every
// log_freq steps (on a terminal, one progress line updated in place between them). A printed
// line gives the step's loss, lr and grad norm, and over the steps since the line before, the
// tokens per second and MFU (time-weighted: total tokens and FLOPs over total time, not one
// step's); then the tokens seen, the epoch, the time elapsed and the ETA. Under mpirun, whose
// output is a pseudo-terminal even when redirected, lines are always plain.
#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "train/tensorboard.h"

namespace bottle {

class MetricsLogger {
 public:
  // Resuming at `first_step` drops lines of later steps that an interrupted run had logged
  // after its last checkpoint, and lines cut short (a full disk), so the file has each step
  // once; `saved_lines` (the checkpoint's step_lines()) are written again where the file lacks
  // them. `tensorboard_dir`: also an event file there (train/ and val/ scalars); "" for none.
  MetricsLogger(const std::string& jsonl_path, int64_t log_freq, int64_t total_steps,
                int64_t first_step, bool resumed, const std::string& tensorboard_dir = "",
                const std::vector<std::string>& saved_lines = {});
  ~MetricsLogger();

  // `row` must hold step (1-based), loss, lr, grad_norm, tokens_per_s, mfu, peak_bytes, ms,
  // tokens_seen (the run's, a resumed run's earlier ones included) and epoch (0-based).
  void log_step(const nlohmann::json& row);
  // Adds val_loss to the step's JSON line and prints it on its own line.
  void log_eval(int64_t step, double val_loss);
  void message(const std::string& text);
  const std::string& path() const { return path_; }
  // A write to metrics.jsonl failed (a full disk): "" while every write succeeded, else the
  // reason. The trainer stops at the end of the step, with a checkpoint, rather than go on
  // with a truncated file; writes after a failure are not attempted.
  const std::string& write_error() const {
    return write_error_.empty() && tensorboard_ ? tensorboard_->write_error() : write_error_;
  }
  // The failed write named by its file: "PATH: cannot write metrics.jsonl (reason)", or the
  // TensorBoard event file's (a full TensorBoard directory is not metrics.jsonl's fault).
  std::string describe_write_error() const;
  // The lines of the latest step (its row, and its evaluation's), written or not: a checkpoint
  // of that step keeps them, so that a resume rewrites a line a full disk cut.
  const std::vector<std::string>& step_lines() const { return step_lines_; }

 private:
  void end_progress_line();
  void write_line(const std::string& line);
  std::string path_;
  std::string write_error_;
  std::vector<std::string> step_lines_;  // the latest step's lines
  std::ofstream out_;
  std::unique_ptr<TensorBoardWriter> tensorboard_;
  int64_t log_freq_, total_steps_, first_step_;
  bool tty_;
  bool progress_open_ = false;
  double elapsed_ms_ = 0.0;  // this process's steps
  // Since the last printed line: steps' time, and time-weighted rates (Σ rate·ms).
  double interval_ms_ = 0.0, interval_token_ms_ = 0.0, interval_mfu_ms_ = 0.0;
  bool interval_mfu_known_ = true;
};

}  // namespace bottle
