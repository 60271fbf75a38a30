#pragma once
// The training loop of `bottle train`: data, forward/backward over gradient-accumulation
// micro-batches, global-norm clipping, AdamW with a schedule, validation, metrics,
// atomic checkpoints with bit-exact resume, and a clean stop on SIGINT/SIGTERM.
#include <memory>
#include <string>

#include "train/train_config.h"

namespace bottle {

struct TrainOptions {
  bool resume = false;      // continue from the newest checkpoint in checkpoint.folder
  std::string init_from;    // start from the weights of a model directory
  std::string config_path;  // for messages
};

struct TrainResult {
  int64_t steps_done = 0;  // the step the run ended at
  double last_loss = 0.0;
  double last_val_loss = -1.0;  // -1: never evaluated
  double tokens_per_s = 0.0;    // median over the run's steps
  bool interrupted = false;
  bool already_complete = false;  // --resume found the last step done: nothing was trained
  std::string last_checkpoint;
};

// Throws bottle::Error for bad input (data, checkpoints, a NaN loss when configured to stop).
TrainResult train(const TrainConfig& config, const TrainOptions& options);

}  // namespace bottle
