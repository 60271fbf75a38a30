#pragma once
// Training checkpoints: folder/step_00000200/ holds config.json, the weights and the
// optimizer's named state (its name in the index) as every rank holds them (rank-RRRRR.safetensors,
// one per writing rank, written in parallel, with checkpoint_index.json naming the pieces:
// model/sharded_checkpoint.h), and trainer_state.json (step, data position, config, ...). Any
// layout reads them back (eval, sample, --init-from, --resume); `bottle export` consolidates the
// weights into the model transformers reads. Checkpoints written before (model.safetensors /
// optimizer.safetensors, or HF's sharded files with an index) still load. Everything is written
// into a temporary directory, fsync'ed and renamed into place, so an interrupted write never
// replaces or damages the last good checkpoint; the last `keep` are kept.
//
// The store touches only its own step folders: a folder named kStepPrefix and a step number
// (step_00000200) that holds the marker file kCheckpointMarker, or, for checkpoints written
// before the marker existed, a trainer_state.json that reads. They are ordered by their step
// number. A folder named like a step that is not ours is refused by name (never resumed from,
// replaced or deleted); other names (step_00000010.bak) are not the store's and are ignored.
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "model/llama.h"
#include "train/optimizer.h"
#include "train/trainer_state.h"

namespace bottle {

// The file that marks a step folder as one bottle wrote.
inline constexpr const char* kCheckpointMarker = "bottle_checkpoint";

// The model directory a command was given: `path` itself when it holds config.json; for a
// run's folder (checkpoint.folder), its newest complete checkpoint (the caller says which);
// else `path` unchanged (the loader's error names what is missing).
std::string model_directory(const std::string& path);

// Throws when `path` is a run's folder (it holds a file `bottle train` writes at its start:
// train_config.toml, metrics.jsonl or .bottle.lock) without config.json or any complete
// checkpoint yet: what a command given it as a model says, instead of a missing file's error.
void check_not_a_run_without_checkpoint(const std::string& path);

class CheckpointStore {
 public:
  // Throws naming the folder when it cannot hold checkpoints (a file, a symlink loop, an
  // unwritable place).
  CheckpointStore(std::string folder, int keep);

  // Returns the checkpoint's directory. Every rank of the job calls it: each writes what it
  // holds (a DP replica nothing unless ZeRO shards the state), nothing is gathered, and all
  // return once the checkpoint is complete. A failure on any rank (a full disk, the folder
  // deleted under the save) fails every rank with one message. masters: what this rank holds
  // of its stage's fp32 masters (DataParallel::held_masters).
  std::string save(const LlamaModel& model, const Optimizer& optimizer, const FlatSource& masters,
                   const TrainerState& state, int64_t step, Communicator* dp = nullptr,
                   Communicator* world = nullptr);
  // checkpoint.async (TorchTitan's asynchronous checkpointing): the same save, but each rank
  // copies what it holds to host memory at once and a background thread writes it while
  // training goes on. The checkpoint is published (its index, its state, the rename into
  // place, pruning) by finish_pending(), which the next save, a stop and the run's end call;
  // until then the newest checkpoint is the one before, and a kill leaves it so. Returns the
  // directory the checkpoint will have. Every rank calls it.
  std::string save_async(const LlamaModel& model, const Optimizer& optimizer,
                         const FlatSource& masters, const TrainerState& state, int64_t step,
                         Communicator* dp = nullptr, Communicator* world = nullptr);
  // Waits for the save under way and publishes it (every rank calls); its directory, "" when
  // none was under way. A write that failed on any rank fails every rank with its message.
  std::string finish_pending(Communicator* world = nullptr);
  bool save_pending() const { return pending_ != nullptr; }
  // Bytes of host memory an asynchronous save holds: the copy of `values` values.
  static size_t async_copy_bytes(int64_t values) { return size_t(values) * sizeof(float); }
  ~CheckpointStore();
  CheckpointStore(const CheckpointStore&) = delete;
  CheckpointStore& operator=(const CheckpointStore&) = delete;
  // Complete checkpoints (ours, with trainer_state.json), oldest step first.
  std::vector<std::string> list() const;
  // Our step folders without trainer_state.json (a damaged one), oldest step first.
  std::vector<std::string> incomplete() const;
  std::optional<std::string> latest() const;
  // The steps whose save never completed (the store's .tmp-step_N folders: a process killed
  // while writing), oldest first; the next save removes their folders.
  std::vector<int64_t> interrupted_saves() const;
  // The newest complete checkpoint in `folder`, read only: no check that the folder could be
  // written to, as a run's would be.
  static std::optional<std::string> newest(const std::string& folder);
  // Throws naming the first entry named like a step folder that the store did not write.
  void check_no_foreign_steps() const;
  // The step of a step folder's name (step_00000200: 200), none for any other name.
  static std::optional<int64_t> step_of(const std::string& dir);
  // The tokenizer saved into every checkpoint (as HF lays it out beside config.json); none
  // for byte-level data. Not owned: the trainer keeps it.
  void set_tokenizer(const Tokenizer* tokenizer) { tokenizer_ = tokenizer; }
  // Called by the writing rank before it creates anything in the folder, before it renames a
  // checkpoint into place and before it prunes: throws when the folder is no longer the run's
  // (deleted, or taken by another run), so that a save under way never writes into, nor prunes,
  // another run's folder.
  void set_folder_guard(std::function<void()> guard) { guard_ = std::move(guard); }

  // Loads weights, moments and returns the trainer state; errors name the file.
  static TrainerState load(const std::string& dir, LlamaModel& model, Optimizer& optimizer);

 private:
  struct ReadOnly {};
  CheckpointStore(ReadOnly, std::string folder);
  // One part of a save on every rank of `world` (nullptr: this process alone); a failure
  // on any rank (a filesystem error named by its path, the folder guard's) fails them all.
  void save_part(Communicator* world, int64_t step, const std::function<void()>& part) const;
  void open_temporary(const LlamaModel& model, const std::filesystem::path& temp) const;
  void write_shards(const LlamaModel& model, const Optimizer& optimizer, const FlatSource& masters,
                    const std::filesystem::path& temp, Communicator* dp, int world_rank) const;
  void place(const std::string& optimizer, int64_t optimizer_steps, const TrainerState& state,
             int64_t step, const std::filesystem::path& temp,
             const std::filesystem::path& final_dir) const;
  std::vector<std::string> list(bool complete) const;
  // Our step folders as (step, path), oldest first, and the foreign ones with the reason.
  struct Scan {
    std::vector<std::pair<int64_t, std::string>> complete, incomplete;
    std::vector<std::pair<std::string, std::string>> foreign;  // (path, why it is not ours)
  };
  Scan scan() const;

  struct Pending;  // an asynchronous save under way
  std::unique_ptr<Pending> pending_;
  std::string folder_;
  int keep_;
  const Tokenizer* tokenizer_ = nullptr;
  std::function<void()> guard_;  // set_folder_guard's; none: no check
};

}  // namespace bottle
