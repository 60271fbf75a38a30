#pragma once
// --resume continues the run a checkpoint was saved by, or says why it cannot.
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "train/shard_record.h"
#include "train/train_config.h"
#include "train/trainer_state.h"

namespace bottle {

// The run that resumes, as the checks read it.
struct ResumingRun {
  const TrainConfig& config;
  const std::string& config_path;           // where it was read from, for the messages
  const std::vector<SourceRecord>& shards;  // data.train's shards as the run opened them
  const Tokenizer* tokenizer;               // the run's, null for bytes
  bool leader;                              // rank 0: says what it keeps
};

// A resume continues the run the checkpoint was saved by. Its data position counts windows of
// micro_batch_size x seq_len + 1 tokens of data.train's shards, in the order training.seed
// shuffles them: under another shape, seed or data it would skip or repeat data without a word.
// Another tokenizer would travel into the later checkpoints beside weights trained on other ids.
// So these are refused, each naming the key, both values and the way forward; data.train
// holding the same shards under another path is kept, said in one line (check_same_shards).
void check_continues_the_run(const TrainerState& state, const std::string& checkpoint,
                             const Tokenizer* saved_tokenizer, const ResumingRun& run);

}  // namespace bottle
