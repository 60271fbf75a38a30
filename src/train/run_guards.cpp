#include "train/run_guards.h"

#include <cstdio>
#include <set>

#include "core/error.h"
#include "data/shard_meta.h"
#include "train/checkpoint_store.h"
#include "train/data_files.h"
#include "train/folder_lock.h"
#include "train/trainer_state.h"

namespace bottle {

namespace fs = std::filesystem;

std::string in_folder(const std::string& folder, const std::string& path) {
  return fs::path(path).is_absolute() ? path : (fs::path(folder) / path).string();
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> files;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return files;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end && files.size() < 4096;
       it.increment(ec))
    if (it->is_regular_file(ec)) files.push_back(it->path().string());
  return files;
}

fs::path tokenizer_directory(const TrainConfig& config,
                             const std::vector<std::string>& data_files) {
  if (!config.data.tokenizer.empty()) {
    std::error_code ec;
    const fs::path p(config.data.tokenizer);
    return fs::is_directory(p, ec) ? p : p.parent_path();
  }
  return data_files.empty() ? fs::path() : fs::path(data_files.front()).parent_path() / "tokenizer";
}

void check_output_paths(const TrainConfig& config, const std::string& config_path,
                        const std::vector<std::string>& data_files, const std::string& init_from) {
  // A path that cannot be resolved (a symlink loop, a file used as a folder) is named here
  // rather than surfacing as a filesystem exception.
  auto resolved = [&](const std::string& key, const std::string& p) {
    std::error_code ec;
    fs::path path = fs::weakly_canonical(fs::absolute(p, ec), ec);
    if (ec) fail("{}: {} ({}) cannot be used: {}", config_path, key, p, ec.message());
    return path;
  };
  const fs::path folder = resolved("checkpoint.folder", config.checkpoint.folder);
  // Checkpoints live in step_* (and .tmp-*) folders of checkpoint.folder.
  auto inside_a_checkpoint = [&](const fs::path& path) {
    const fs::path inside = path.lexically_relative(folder);
    const std::string first = inside.empty() ? "" : inside.begin()->string();
    return first.rfind("step_", 0) == 0 || first.rfind(".tmp-", 0) == 0;
  };
  struct Output {
    std::string key;
    fs::path path;
  };
  std::vector<Output> outputs = {
      {"metrics.jsonl",
       resolved("metrics.jsonl", in_folder(config.checkpoint.folder, config.metrics.jsonl))}};
  if (!config.metrics.plot.empty()) {
    const std::string png = in_folder(config.checkpoint.folder, config.metrics.plot);
    outputs.push_back({"metrics.plot", resolved("metrics.plot", png)});
    // plot_metrics writes its data and script beside the image.
    for (const char* suffix : {".train.dat", ".val.dat", ".gp"})
      outputs.push_back({"metrics.plot's scratch file", resolved("metrics.plot", png + suffix)});
  }
  std::vector<Output> others = {
      {"train_config.toml",
       resolved("checkpoint.folder",
                (fs::path(config.checkpoint.folder) / "train_config.toml").string())},
      {"the config file", resolved("the config file", config_path)},
      {"checkpoint.folder's lock file",
       resolved("checkpoint.folder",
                (fs::path(config.checkpoint.folder) / kFolderLockFile).string())}};
  for (const std::string& f : data_files) others.push_back({"data", resolved("data", f)});
  // The run saves its tokenizer into the folder under the names transformers reads.
  for (const char* name : {"tokenizer.json", "tokenizer.model", "tokenizer.tiktoken",
                           "tokenizer_config.json", "special_tokens_map.json"})
    others.push_back(
        {fmt::format("the run's copy of its tokenizer ({})", name),
         resolved("checkpoint.folder", (fs::path(config.checkpoint.folder) / name).string())});
  const fs::path tokenizer_dir = tokenizer_directory(config, data_files);
  for (const std::string& f : files_in(tokenizer_dir))
    others.push_back({"a file of the run's tokenizer", resolved("data.tokenizer", f)});
  if (!init_from.empty()) {
    const fs::path input = resolved("--init-from", init_from);
    // The run writes train_config.toml, its tokenizer and its checkpoints into the folder.
    BOTTLE_CHECK(input != folder,
                 "--init-from {} is checkpoint.folder ({}): the run would write its checkpoints, "
                 "metrics and tokenizer into its own input; choose another checkpoint.folder",
                 init_from, config.checkpoint.folder);
    const fs::path inside = input.lexically_relative(folder);
    BOTTLE_CHECK(inside.empty() || inside.begin()->string().rfind(kStepPrefix, 0) != 0,
                 "--init-from {} lies inside a checkpoint of checkpoint.folder ({}), which the run "
                 "would replace or delete as it keeps its newest checkpoints; copy it elsewhere "
                 "or choose another checkpoint.folder",
                 init_from, config.checkpoint.folder);
    for (const std::string& f : files_in(input))
      others.push_back({"a file of --init-from's model", resolved("--init-from", f)});
  }
  if (!tokenizer_dir.empty())
    BOTTLE_CHECK(resolved("data.tokenizer", tokenizer_dir.string()) != folder,
                 "{}: checkpoint.folder ({}) is the directory of the run's tokenizer, which the "
                 "run would overwrite with its own copy; choose another checkpoint.folder",
                 config_path, config.checkpoint.folder);
  // TensorBoard's directory receives event files: never among the run's inputs, never inside
  // a checkpoint.
  if (!config.metrics.tensorboard.empty()) {
    const fs::path events = resolved(
        "metrics.tensorboard", in_folder(config.checkpoint.folder, config.metrics.tensorboard));
    BOTTLE_CHECK(!inside_a_checkpoint(events),
                 "{}: metrics.tensorboard ({}) lies inside a checkpoint of checkpoint.folder, "
                 "which a checkpoint would overwrite or remove",
                 config_path, events.string());
    for (const Output& input : others)
      if (input.key == "data" || input.key.starts_with("a file of"))
        BOTTLE_CHECK(input.path.parent_path() != events,
                     "{}: metrics.tensorboard ({}) is the directory of {} ({}): the run's event "
                     "files would go among its inputs; choose another directory",
                     config_path, events.string(), input.key, input.path.string());
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Output& out = outputs[i];
    // A device (/dev/full) or FIFO takes no file and may block, or never end when read back.
    std::error_code ec;
    BOTTLE_CHECK(!fs::exists(out.path, ec) || fs::is_regular_file(out.path, ec),
                 "{}: {} ({}) must be a regular file (not a device, FIFO or directory)",
                 config_path, out.key, out.path.string());
    BOTTLE_CHECK(out.path != folder, "{}: {} names checkpoint.folder itself ({})", config_path,
                 out.key, out.path.string());
    BOTTLE_CHECK(!inside_a_checkpoint(out.path),
                 "{}: {} ({}) lies inside a checkpoint of checkpoint.folder, which a checkpoint "
                 "would overwrite or remove",
                 config_path, out.key, out.path.string());
    for (size_t j = 0; j < i; ++j)
      BOTTLE_CHECK(out.path != outputs[j].path, "{}: {} and {} name the same file {}", config_path,
                   outputs[j].key, out.key, out.path.string());
    for (const Output& other : others)
      BOTTLE_CHECK(out.path != other.path, "{}: {} names {} ({}), which it would overwrite",
                   config_path, out.key, other.key, out.path.string());
  }
}

std::string job_description(const TrainConfig& config, const TrainOptions& options) {
  std::string text = to_toml(config);
  // One line per key: a line break in a path must not start another.
  std::string init_from = options.init_from;
  for (size_t at; (at = init_from.find('\n')) != std::string::npos;)
    init_from.replace(at, 1, "\\n");
  text += fmt::format("\n[]\n--resume = {}\n--init-from = \"{}\"\n", options.resume, init_from);
  text += "\n[data]\n";
  std::vector<std::pair<std::string, std::string>> splits;
  for (size_t i = 0; i < config.data.train.size(); ++i)
    splits.emplace_back(fmt::format("train source {}'s files", i + 1), config.data.train[i]);
  splits.emplace_back("val's files", config.data.val);
  for (const auto& [key, pattern] : splits) {
    std::string files;
    try {
      if (!pattern.empty())
        for (const std::string& f : resolve_data_files(pattern)) {
          std::error_code ec;
          files += fmt::format("{}{} ({} bytes)", files.empty() ? "" : ", ", f,
                               int64_t(fs::file_size(f, ec)));
        }
    } catch (const Error& e) {
      // Named again, with its own message, when the data is opened.
      files = fmt::format("unreadable ({})", e.what());
    }
    text += fmt::format("{} = {}\n", key, files.empty() ? "none" : files);
  }
  return text;
}

void check_tokenizer_matches_shards(const Tokenizer* tokenizer,
                                    const std::vector<std::string>& files,
                                    const TrainConfig& config, const std::string& config_path) {
  // Each directory's description once (a mixture's sources may come from several).
  std::set<fs::path> seen;
  for (const std::string& file : files) {
    if (!seen.insert(fs::path(file).parent_path()).second) continue;
    const auto meta = split_meta_of_shard(file);
    if (!meta || meta->second.tokenizer_kind.empty()) continue;
    const SplitMeta& m = meta->second;
    // No tokenizer because the model's vocabulary is too small for the shards' (byte shards
    // with model.vocab_size below 256): the key to change is the vocabulary's.
    BOTTLE_CHECK(
        tokenizer || !config.data.tokenizer.empty() || config.model.vocab_size >= m.vocab_size,
        "{}: key 'model.vocab_size' is {}, but {} says the shards of data.train hold "
        "{} tokens of a vocabulary of {}; set model.vocab_size to at least {}",
        config_path, config.model.vocab_size, meta->first.string(), m.tokenizer_kind, m.vocab_size,
        m.vocab_size);
    const bool same = tokenizer && tokenizer->kind() == m.tokenizer_kind &&
                      tokenizer->vocab_size() == m.vocab_size;
    BOTTLE_CHECK(same,
                 "{}: {} is {}, but {} says the shards of data.train were made with {} ({} kind, "
                 "vocabulary {}); set data.tokenizer to that tokenizer, or leave it unset to use "
                 "the one `bottle prepare` saved beside the shards",
                 config_path,
                 config.data.tokenizer.empty()
                     ? std::string("the run's tokenizer (data.tokenizer unset)")
                     : "data.tokenizer = " + config.data.tokenizer,
                 tokenizer ? tokenizer->describe() : std::string("none"), meta->first.string(),
                 m.tokenizer, m.tokenizer_kind, m.vocab_size);
  }
}

bool same_tokenizer(const Tokenizer* a, const Tokenizer* b) {
  if (!a || !b) return a == b;
  if (a->kind() != b->kind() || a->vocab_size() != b->vocab_size()) return false;
  const std::string probe =
      "Hello, world! 0123 456789\n\tThe  quick-brown fox's \u00e9t\u00e9 "
      "\u4e2d\u6587 \U0001F600 <|endoftext|></s>";
  std::vector<int32_t> ia, ib;
  a->encode(probe, ia);
  b->encode(probe, ib);
  return ia == ib;
}

void check_vocabulary(std::span<const int32_t> tokens, int64_t vocab, const std::string& data) {
  for (const int32_t id : tokens)
    if (id < 0 || id >= vocab)
      fail("{}: token id {} is outside the model's vocabulary [0, {}) (model.vocab_size)", data, id,
           vocab);
}

}  // namespace bottle
