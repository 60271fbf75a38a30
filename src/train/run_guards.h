#pragma once
// What `bottle train` checks before and while it trains, apart from the loop
// (train/trainer.cpp): that the run's outputs name neither one another nor an input, that its
// ranks agree on the job, that its tokenizer is the shards', that the batches' ids fit the
// model.
#include <cstdint>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "data/tokenizer.h"
#include "train/train_config.h"
#include "train/trainer.h"

namespace bottle {

// A run's output path as it is written: itself when absolute, else inside the checkpoint
// folder `folder` (metrics.jsonl, metrics.plot, metrics.tensorboard).
std::string in_folder(const std::string& folder, const std::string& path);

// The regular files directly in `dir` (a model or tokenizer directory: a few files), none when
// it is not a directory. Bounded, so that a huge directory named by mistake costs nothing.
std::vector<std::string> files_in(const std::filesystem::path& dir);

// The directory the run's tokenizer is read from: data.tokenizer's (itself or the file's), else
// the one `bottle prepare` saved beside the first training shard (find_run_tokenizer's rule).
std::filesystem::path tokenizer_directory(const TrainConfig& config,
                                          const std::vector<std::string>& data_files);

// The run's outputs (metrics.jsonl, metrics.plot, train_config.toml, the checkpoints) must not
// name one another nor any input (the configuration, the data, the tokenizer's files,
// --init-from's model): writing one would destroy another.
void check_output_paths(const TrainConfig& config, const std::string& config_path,
                        const std::vector<std::string>& data_files, const std::string& init_from);

// What every rank of a job must agree on: the resolved configuration, the options that change
// what the run does, and the data files as this rank sees them (names and sizes). Written as
// TOML-like lines so that a difference is named by its key; "[]" starts the keys of no section.
std::string job_description(const TrainConfig& config, const TrainOptions& options);

// The shards' own description names the kind and vocabulary of the tokenizer they were made
// with: a run told another one would save with its checkpoints a tokenizer whose ids mean other
// text (and eval, sample and transformers would read them with it).
void check_tokenizer_matches_shards(const Tokenizer* tokenizer,
                                    const std::vector<std::string>& files,
                                    const TrainConfig& config, const std::string& config_path);

// Whether two tokenizers make the same ids: the same kind and vocabulary, and the same ids for
// a text that touches letters, digits, spaces, punctuation and multi-byte characters.
bool same_tokenizer(const Tokenizer* a, const Tokenizer* b);

// Token ids must fit the model; the error names the data rather than a kernel. Checked in
// the host copy of the batch, so the device is never waited for.
void check_vocabulary(std::span<const int32_t> tokens, int64_t vocab, const std::string& data);

}  // namespace bottle
