#pragma once
// Training checkpoints: folder/step_00000200/ holds config.json, the weights and the AdamW
// moments of each pipeline stage and TP rank (model.safetensors / optimizer.safetensors on
// one rank; else HF's sharded model-0000k-of-0000n.safetensors with
// model.safetensors.index.json, and the same for optimizer-*), and trainer_state.json
// (step, data position, config, ...). The weights alone are a complete model (any layout
// reads them; `bottle export` merges the shards). Everything is written into a temporary
// directory, fsync'ed and renamed into place, so an interrupted write never replaces or
// damages the last good checkpoint; the last `keep` are kept.
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/llama.h"
#include "train/adamw.h"
#include "train/trainer_state.h"

namespace bottle {

class CheckpointStore {
 public:
  // Throws naming the folder when it cannot hold checkpoints (a file, a symlink loop, an
  // unwritable place).
  CheckpointStore(std::string folder, int keep);

  // Returns the checkpoint's directory. Every rank of the job calls it: the TP slices (and
  // a ZeRO-1 optimizer's DP shards) are gathered, one rank writes, and all return once the
  // checkpoint is complete (a barrier over `world`).
  std::string save(const LlamaModel& model, const AdamW& optimizer, const TrainerState& state,
                   int64_t step, Communicator* dp = nullptr, Communicator* world = nullptr);
  // Complete checkpoints, oldest first.
  std::vector<std::string> list() const;
  // step_* directories without trainer_state.json (a foreign or damaged write), oldest first.
  std::vector<std::string> incomplete() const;
  std::optional<std::string> latest() const;
  // The tokenizer saved into every checkpoint (as HF lays it out beside config.json); none
  // for byte-level data. Not owned: the trainer keeps it.
  void set_tokenizer(const Tokenizer* tokenizer) { tokenizer_ = tokenizer; }

  // Loads weights, moments and returns the trainer state; errors name the file.
  static TrainerState load(const std::string& dir, LlamaModel& model, AdamW& optimizer);

 private:
  std::string save_unchecked(const LlamaModel& model, const AdamW& optimizer,
                             const TrainerState& state, int64_t step, Communicator* dp,
                             Communicator* world);
  std::vector<std::string> list(bool complete) const;

  std::string folder_;
  int keep_;
  const Tokenizer* tokenizer_ = nullptr;
};

}  // namespace bottle
