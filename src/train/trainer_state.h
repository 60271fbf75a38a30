#pragma once
// trainer_state.json, the file that makes a step directory a complete checkpoint: the step,
// the optimizer's step count, the data position, the seed and the resolved configuration.
// One writer and one reader: the checkpoint store writes what the trainer hands it, and
// --resume gets the fields back already checked.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "train/data_mixture.h"
#include "train/shard_record.h"

namespace bottle {

inline constexpr const char* kTrainerStateFile = "trainer_state.json";
// A checkpoint's directory is this prefix and its step, zero-padded (step_00000200).
inline constexpr const char* kStepPrefix = "step_";

struct TrainerState {
  int64_t step = 0;             // the steps trained
  int64_t optimizer_steps = 0;  // AdamW's steps: at most `step`, skipped steps take none
  DataPosition train_position;  // one LoaderPosition per data.train source
  std::optional<int64_t> seed;  // training.seed; checkpoints of older versions lack it
  // Each data.train source's shards (name, bytes, tokens), which --resume compares with the
  // data it is given; checkpoints of older versions lack it.
  std::optional<std::vector<SourceRecord>> data_shards;
  // The step's lines of metrics.jsonl, which --resume writes again where a full disk cut them.
  std::vector<std::string> metrics_lines;
  // The resolved configuration as TOML, for people: --resume reads the configuration it is
  // given. Left empty when the file holds none (or not as text), as no reader needs it.
  std::string config;
};

// Writes dir/trainer_state.json (an indented JSON object, keys in order, a final newline);
// the caller syncs it. Errors name the file.
void write_trainer_state(const std::filesystem::path& dir, const TrainerState& state);
// Reads dir/trainer_state.json, each field checked (type, range, the step against the
// directory's name); errors name the file and the key.
TrainerState read_trainer_state(const std::string& dir);

}  // namespace bottle
