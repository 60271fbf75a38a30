// `bottle inspect PATH [--json]`: what a checkpoint, a run or a data set holds, without
// loading a weight. PATH may be
//   - a model directory (a checkpoint or an export): the model, its parameters, the dtype its
//     weights are stored in, its tokenizer and, for a training checkpoint, the step, the data
//     position, the seed and the loss the run logged at that step;
//   - a run's folder (checkpoint.folder): its checkpoints, then its newest one as above, and
//     the last losses of metrics.jsonl;
//   - prepare's output (a directory of shards or one shard): each split's documents, tokens,
//     shards and tokenizer.
// Every file read is bounded (io/file_read.h through read_json_file); errors name the file.
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "apps/commands.h"
#include "core/error.h"
#include "io/file_read.h"
#include "io/json_io.h"
#include "io/safetensors.h"
#include "io/token_shard.h"
#include "data/shard_meta.h"
#include "model/checkpoint.h"
#include "train/checkpoint_store.h"
#include "train/run_tokenizer.h"
#include "train/trainer_state.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

// The last step line at or before `step` of a run's metrics.jsonl, and its last val_loss
// line there: what the run logged when it saved that checkpoint.
ojson logged_losses(const fs::path& metrics, std::optional<int64_t> step) {
  ojson out = ojson::object();
  std::error_code ec;
  if (!fs::is_regular_file(metrics, ec)) return out;
  for_each_bounded_line(
      metrics.string(), "the run's metrics.jsonl", kMaxJsonLinesFileBytes, kMaxJsonLineBytes,
      [&](std::string_view line, int64_t) {
        const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
        if (!j.is_object() || !j.contains("step") || !j["step"].is_number_integer()) return;
        const int64_t s = j["step"].get<int64_t>();
        if (step && s > *step) return;
        if (j.contains("loss") && j["loss"].is_number()) {
          out["step"] = s;
          out["loss"] = j["loss"];
        }
        if (j.contains("val_loss") && j["val_loss"].is_number()) {
          out["val_step"] = s;
          out["val_loss"] = j["val_loss"];
        }
      });
  return out;
}

ojson model_json(const std::string& dir) {
  const ModelConfig c = read_model_config(dir);
  ojson m;
  m["directory"] = dir;
  m["kind"] = bottleneck_kind_name(c.bottleneck);
  m["hidden_size"] = c.hidden_size;
  m["intermediate_size"] = c.intermediate_size;
  m["num_layers"] = c.num_layers;
  m["num_heads"] = c.num_heads;
  m["num_kv_heads"] = c.num_kv_heads;
  m["vocab_size"] = c.vocab_size;
  m["max_seq_len"] = c.max_seq_len;
  m["tie_embeddings"] = c.tie_embeddings;
  if (c.bottleneck != BottleneckKind::none) {
    ojson ranks = ojson::object();
    for (int i = 0; i < kNumProjections; ++i)
      ranks[kProjectionNames[i]] = c.rank_of(ProjectionId(i));
    m["ranks"] = ranks;
  }
  m["parameters"] = c.parameter_count();
  // The dtype the tensors are stored in, from the safetensors headers (config.json's
  // torch_dtype is only what its writer said).
  std::set<std::string> dtypes;
  auto add_dtype = [&](const std::string& d) {
    dtypes.insert(d == "F32" ? "float32" : d == "BF16" ? "bfloat16" : d == "F16" ? "float16" : d);
  };
  if (is_sharded_checkpoint(dir)) {
    // A training checkpoint: every rank's file of pieces (model/sharded_checkpoint.h).
    // Reads and checks the index: a damaged one fails here.
    const ShardedCheckpoint checkpoint(dir);
    std::set<std::string> files;
    for (const auto& e : fs::directory_iterator(dir))
      if (is_rank_file_name(e.path().filename().string())) files.insert(e.path().string());
    for (const std::string& file : files) {
      const SafeTensorsReader reader(file);
      for (const auto& [key, entry] : reader.entries())
        if (key.find('/') == std::string::npos) add_dtype(entry.dtype);
    }
  } else {
    const ShardedReader files(dir, "model");
    for (const std::string& name : files.names())
      add_dtype(files.reader_for(name).entry(name).dtype);
  }
  m["stored_dtype"] = fmt::format("{}", fmt::join(dtypes, " and "));
  const std::unique_ptr<Tokenizer> tokenizer = checkpoint_tokenizer(dir, c);
  m["tokenizer"] =
      tokenizer ? tokenizer->describe() : std::string("none (byte-level ids, no tokenizer)");
  std::error_code ec;
  if (fs::exists(fs::path(dir) / kTrainerStateFile, ec)) {
    const TrainerState state = read_trainer_state(dir);
    ojson t;
    t["step"] = state.step;
    t["optimizer_steps"] = state.optimizer_steps;
    // One source's position, or one per source of a mixture (data.train's order).
    ojson sources = ojson::array();
    for (const LoaderPosition& p : state.train_position.sources)
      sources.push_back({{"epoch", p.epoch}, {"shard", p.shard_index}, {"window", p.window_index}});
    t["data_position"] = sources.size() == 1 ? sources[0] : sources;
    t["seed"] = state.seed ? ojson(*state.seed) : ojson();
    t["logged"] = logged_losses(fs::path(dir).parent_path() / "metrics.jsonl", state.step);
    m["training"] = t;
  }
  return m;
}

// The splits of prepare's output: `path` a directory of shards or one shard.
ojson data_json(const std::string& path) {
  std::set<fs::path> metas;
  std::vector<fs::path> shards;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    for (const auto& e : fs::directory_iterator(path, ec))
      if (parse_shard_name(e.path().filename().string())) shards.push_back(e.path());
  } else {
    shards.push_back(path);
  }
  for (const fs::path& shard : shards)
    if (const auto meta = split_meta_of_shard(shard.string())) metas.insert(meta->first);
  BOTTLE_CHECK(!metas.empty(),
               "{}: no split description (PREFIX_train.json, PREFIX_val.json) of `bottle "
               "prepare` found for its shards",
               path);
  ojson splits = ojson::array();
  for (const fs::path& file : metas) {
    const SplitMeta m = read_split_meta(file);
    // The tokens the shards hold, from their headers: a description that disagrees with them
    // (a shard replaced or cut short since) is named, not repeated.
    for (const ShardEntry& shard : m.shards) {
      const std::string shard_path = (file.parent_path() / shard.file).string();
      const uint64_t held = token_shard_size(shard_path);
      BOTTLE_CHECK(held == shard.tokens, "{}: holds {} tokens, but {} says {}", shard_path, held,
                   file.string(), shard.tokens);
    }
    splits.push_back({{"description", file.string()},
                      {"split", m.split},
                      {"documents", m.documents},
                      {"bytes", m.bytes},
                      {"tokens", m.tokens},
                      {"shards", m.shards.size()},
                      {"vocab_size", m.vocab_size},
                      {"tokenizer", m.tokenizer}});
  }
  return ojson{{"data", splits}};
}

ojson inspect(const std::string& path) {
  std::error_code ec;
  BOTTLE_CHECK(fs::exists(path, ec), "{}: no such file or directory", path);
  if (fs::exists(fs::path(path) / "config.json", ec)) return ojson{{"model", model_json(path)}};
  check_not_a_run_without_checkpoint(path);
  if (fs::is_directory(path, ec)) {
    const std::optional<std::string> newest = CheckpointStore::newest(path);
    if (newest) {
      ojson run;
      run["folder"] = path;
      ojson steps = ojson::array();
      for (const auto& e : fs::directory_iterator(path, ec))
        if (const auto step = CheckpointStore::step_of(e.path().filename().string());
            step && fs::exists(e.path() / kTrainerStateFile, ec))
          steps.push_back(*step);
      std::sort(steps.begin(), steps.end());
      run["checkpoints"] = steps;
      run["newest"] = *newest;
      run["logged"] = logged_losses(fs::path(path) / "metrics.jsonl", std::nullopt);
      return ojson{{"run", run}, {"model", model_json(*newest)}};
    }
  }
  return data_json(path);
}

// "step 30: loss 3.1819, val loss 3.2001 (step 30)" from logged_losses' object.
std::string logged_text(const ojson& l) {
  std::string text =
      fmt::format("step {}: loss {:.4f}", l["step"].get<int64_t>(), l["loss"].get<double>());
  if (l.contains("val_loss"))
    text += fmt::format(", val loss {:.4f} (step {})", l["val_loss"].get<double>(),
                        l["val_step"].get<int64_t>());
  return text;
}

// "epoch 1, shard 0, window 2", or "source 1: ...; source 2: ..." for a mixture.
std::string position_text(const ojson& position) {
  DataPosition p;
  for (const ojson& s : position.is_array() ? position : ojson::array({position}))
    p.sources.push_back(
        {s["epoch"].get<uint64_t>(), s["shard"].get<uint64_t>(), s["window"].get<uint64_t>()});
  return describe_position(p);
}

void print_model(const ojson& m) {
  fmt::print("model: {} ({}), {} parameters, stored as {}\n", m["directory"].get<std::string>(),
             m["kind"].get<std::string>(), m["parameters"].get<int64_t>(),
             m["stored_dtype"].get<std::string>());
  fmt::print(
      "  d {}, d_ff {}, {} layers, {} heads ({} kv), vocabulary {}, "
      "positions {}{}\n",
      m["hidden_size"].get<int64_t>(), m["intermediate_size"].get<int64_t>(),
      m["num_layers"].get<int64_t>(), m["num_heads"].get<int64_t>(),
      m["num_kv_heads"].get<int64_t>(), m["vocab_size"].get<int64_t>(),
      m["max_seq_len"].get<int64_t>(), m["tie_embeddings"].get<bool>() ? ", tied embeddings" : "");
  if (m.contains("ranks")) {
    std::string ranks;
    for (const auto& [name, r] : m["ranks"].items())
      ranks += fmt::format("{}{} {}", ranks.empty() ? "" : ", ", name, r.get<int64_t>());
    fmt::print("  ranks: {}\n", ranks);
  }
  fmt::print("  tokenizer: {}\n", m["tokenizer"].get<std::string>());
  if (!m.contains("training")) return;
  const ojson& t = m["training"];
  fmt::print("  step {} ({} optimizer steps), seed {}, data position: {}\n",
             t["step"].get<int64_t>(), t["optimizer_steps"].get<int64_t>(),
             t["seed"].is_null() ? std::string("unrecorded") : t["seed"].dump(),
             position_text(t["data_position"]));
  if (t["logged"].contains("loss")) fmt::print("  logged at {}\n", logged_text(t["logged"]));
}

void print_text(const ojson& out) {
  if (out.contains("run")) {
    const ojson& r = out["run"];
    fmt::print("run: {}, {} checkpoint(s) (steps {}), newest {}\n", r["folder"].get<std::string>(),
               r["checkpoints"].size(), r["checkpoints"].dump(), r["newest"].get<std::string>());
    if (r["logged"].contains("loss")) fmt::print("  last logged at {}\n", logged_text(r["logged"]));
  }
  if (out.contains("model")) print_model(out["model"]);
  if (out.contains("data"))
    for (const ojson& s : out["data"])
      fmt::print(
          "{} split ({}): {} documents, {} bytes, {} tokens in {} shard(s); "
          "vocabulary {}, tokenizer {}\n",
          s["split"].get<std::string>(), s["description"].get<std::string>(),
          s["documents"].get<uint64_t>(), s["bytes"].get<uint64_t>(), s["tokens"].get<uint64_t>(),
          s["shards"].get<size_t>(), s["vocab_size"].get<int64_t>(),
          s["tokenizer"].get<std::string>());
}

}  // namespace

Command add_inspect_command(CLI::App& app) {
  struct Options {
    std::string path;
    bool json = false;
  };
  auto o = std::make_shared<Options>();
  app.add_option("path", o->path,
                 "a model directory (checkpoint or export), a run's folder, or prepare's "
                 "output (a directory of shards or one shard)")
      ->required();
  app.add_flag("--json", o->json, "print one JSON object");
  return [o] {
    const ojson out = inspect(o->path);
    if (o->json)
      fmt::print("{}\n", out.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    else
      print_text(out);
    return 0;
  };
}

}  // namespace bottle
