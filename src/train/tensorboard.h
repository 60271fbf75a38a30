#pragma once
// A TensorBoard sink for training scalars: an event file (events.out.tfevents.TIME.HOST) in a
// directory, in the format TensorBoard reads, written directly (no TensorFlow, no protobuf
// library): TFRecord framing (length, its masked CRC-32C, the record, its masked CRC-32C)
// around hand-encoded `Event` messages (wall_time, step, file_version or a Summary of
// simple_value scalars). tests/train/test_train.cpp reads it back with the tensorboard
// package itself.
//
// A resumed run opens a new file whose first events restart the session at the first step it
// logs, as PyTorch's SummaryWriter(purge_step=) does: TensorBoard then drops the steps an
// earlier file logged past the checkpoint, so every step shows once.
#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>

namespace bottle {

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it; `first_step` > 0 when resuming from it.
  // Errors name the directory or file.
  TensorBoardWriter(const std::string& dir, int64_t first_step);

  // One scalar of `tag` ("train/loss") at `step`. Flushed, so a killed run keeps its events.
  void scalar(std::string_view tag, int64_t step, double value);
  const std::string& path() const { return path_; }
  // "" while every write succeeded, else the reason (the trainer stops as for metrics.jsonl).
  const std::string& write_error() const { return write_error_; }

 private:
  void write_event(const std::string& event);
  std::string path_, write_error_;
  std::ofstream out_;
};

// CRC-32C (Castagnoli) of `data`, as TFRecord frames use it (before masking).
uint32_t crc32c(std::string_view data);

}  // namespace bottle
