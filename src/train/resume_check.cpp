#include "train/resume_check.h"

#include <fmt/format.h>

#include <filesystem>

#include "core/error.h"
#include "train/data_files.h"
#include "train/data_mixture.h"
#include "train/run_guards.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// The saved position indexes windows of the checkpoint's shards in an order drawn from them,
// so data.train must hold the same shards: the checkpoint's record (name relative to its
// source, bytes, tokens) against the run's, whatever the path is spelled now. A checkpoint of
// an older bottle has no record: its data.train is compared by spelling, and when spelt
// otherwise by the shards' names and sizes found at the old path, as before.
void check_same_shards(const TrainerState& state, const TrainConfig& before,
                       const std::string& checkpoint, const std::string& way_out,
                       const ResumingRun& run) {
  const std::string at = describe_position(state.train_position),
                    was_text = config_value_text(before, "data.train"),
                    now_text = config_value_text(run.config, "data.train");
  const bool respelt = before.data.train != run.config.data.train;
  if (state.data_shards) {
    const std::string diff = shard_difference(*state.data_shards, run.shards);
    if (!diff.empty())
      fail(
          "--resume: {} was trained with data.train = {}, {}: {}; the saved position is a shard "
          "and window of each source of the checkpoint's shards in an order drawn from them, so "
          "it would point at other data (saved position: {}); restore the shards to continue "
          "the run, or start a new run from these weights with --init-from {} and another "
          "checkpoint.folder",
          checkpoint, was_text,
          respelt ? fmt::format("but {} says {}, whose shards differ", run.config_path, now_text)
                  : std::string("whose shards differ now"),
          diff, at, checkpoint);
    if (respelt && run.leader)
      fmt::print(
          "data.train is now {} (was {}): the same shards by name, size and token count, so the "
          "saved position ({}) is kept\n",
          now_text, was_text, at);
    return;
  }
  if (run.leader)
    fmt::print(
        "{} records no list of its shards (an older bottle saved it): data.train is compared by "
        "its spelling only, and a shard added or rewritten under it is not noticed\n",
        checkpoint);
  if (!respelt) return;
  // The shards at the old spelling, each source's files by name and size.
  auto shards = [](const std::vector<std::string>& patterns) {
    std::vector<std::vector<std::pair<std::string, uintmax_t>>> out;
    try {
      for (const std::string& pattern : patterns) {
        out.emplace_back();
        for (const std::string& f : resolve_data_files(pattern)) {
          std::error_code ec;
          out.back().emplace_back(fs::path(f).filename().string(), fs::file_size(f, ec));
        }
      }
    } catch (const Error&) {
      out.clear();
    }
    return out;
  };
  const auto was = shards(before.data.train), now = shards(run.config.data.train);
  if (was.empty() || was != now)
    fail(
        "--resume: {} was trained with data.train = {}, but {} says {}: the saved position is a "
        "shard and window of each source of that data (saved position: {}); {}",
        checkpoint, was_text, run.config_path, now_text, at, way_out);
  if (run.leader)
    fmt::print(
        "data.train is now {} (was {}): the same shards by name and size, so the saved "
        "position ({}) is kept\n",
        now_text, was_text, at);
}

}  // namespace

void check_continues_the_run(const TrainerState& state, const std::string& checkpoint,
                             const Tokenizer* saved_tokenizer, const ResumingRun& run) {
  const std::string source = (fs::path(checkpoint) / kTrainerStateFile).string();
  TrainConfig before;
  try {
    before = parse_train_config_string(state.config, source + " (its key 'config')");
  } catch (const Error& e) {
    fail(
        "--resume: {}: the configuration the checkpoint was trained with does not read ({}); "
        "start a new run from its weights with --init-from {}",
        source, e.what(), checkpoint);
  }
  const std::string way_out = fmt::format(
      "set it back to continue the run, or start a new run from these weights with --init-from "
      "{} and another checkpoint.folder",
      checkpoint);
  const std::string at = describe_position(state.train_position);
  auto refuse = [&](const char* key, const std::string& was, const std::string& now,
                    const char* why) {
    fail("--resume: {} was trained with {} = {}, but {} says {}: {} (saved position: {}); {}",
         checkpoint, key, was, run.config_path, now, why, at, way_out);
  };
  const char* shape =
      "the saved data position counts windows of micro_batch_size x seq_len + 1 tokens, so data "
      "would be skipped or repeated";
  if (before.training.micro_batch_size != run.config.training.micro_batch_size)
    refuse("training.micro_batch_size", std::to_string(before.training.micro_batch_size),
           std::to_string(run.config.training.micro_batch_size), shape);
  if (before.training.seq_len != run.config.training.seq_len)
    refuse("training.seq_len", std::to_string(before.training.seq_len),
           std::to_string(run.config.training.seq_len), shape);
  const int64_t seed = state.seed.value_or(before.training.seed);
  if (seed != run.config.training.seed)
    refuse("training.seed", std::to_string(seed), std::to_string(run.config.training.seed),
           "the seed orders the shards and windows of every epoch, so the saved position would "
           "point elsewhere in another order");
  check_same_shards(state, before, checkpoint, way_out, run);
  // The mixture's choices follow its weights over the whole run: others would first make up
  // for the steps already trained.
  if (before.data.weights != run.config.data.weights) {
    refuse("data.weights", config_value_text(before, "data.weights"),
           config_value_text(run.config, "data.weights"),
           "each source's share of the batches is counted from the first step, so new weights "
           "would first over-draw the sources they raise");
  }
  // Another accumulation or data-parallel width keeps the windows' order and the position
  // (one stream of windows for the whole job): each step now takes another number of them.
  const int64_t windows_before = before.training.grad_accum_steps * before.parallel.dp,
                windows_now = run.config.training.grad_accum_steps * run.config.parallel.dp;
  if (windows_before != windows_now && run.leader)
    fmt::print(
        "training.grad_accum_steps x parallel.dp is now {} x {} (was {} x {}): the data "
        "continues from the saved position ({}), {} windows a step instead of {}\n",
        run.config.training.grad_accum_steps, run.config.parallel.dp,
        before.training.grad_accum_steps, before.parallel.dp, at, windows_now, windows_before);
  if (!same_tokenizer(saved_tokenizer, run.tokenizer))
    fail(
        "--resume: {} holds the tokenizer {}, but the run's is {} ({}): its weights were "
        "trained on the checkpoint's ids; set data.tokenizer to the checkpoint's tokenizer (or "
        "back to {}), or start a new run from these weights with --init-from {}",
        checkpoint, saved_tokenizer ? saved_tokenizer->describe() : std::string("none"),
        run.tokenizer ? run.tokenizer->describe() : std::string("none"),
        run.config.data.tokenizer.empty() ? std::string("data.tokenizer unset")
                                          : "data.tokenizer = " + run.config.data.tokenizer,
        before.data.tokenizer.empty() ? std::string("unset")
                                      : fmt::format("\"{}\"", before.data.tokenizer),
        checkpoint);
}

}  // namespace bottle
