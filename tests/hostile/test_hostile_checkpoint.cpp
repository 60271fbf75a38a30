// Hostile checkpoints and model configurations (issue 12 §3, cases 1, 4, 7, 9, 10, 11, 12):
// each is refused with exit status 1 and one message naming the file, key or tensor, within
// 10 s (the command runs under `timeout`, so a hang fails too), and nothing is overwritten.
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace bottle::testing {
namespace {

const bool passive_omp = [] { return ::setenv("OMP_WAIT_POLICY", "passive", 0) == 0; }();

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void write_file(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// `command` under a 10 s limit: a hang ends as status 124.
CommandResult run10(const std::string& command) { return run("timeout -k 2 10 " + command); }

void expect_refused(const CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("bottle: error:"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
  for (const std::string& n : needles)
    EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in: " << r.output;
}

// A safetensors file split into its JSON header and its data section.
struct SafeTensorsFile {
  std::string header, data;

  static SafeTensorsFile read(const std::string& path) {
    const std::string all = read_file(path);
    uint64_t n = 0;
    std::memcpy(&n, all.data(), 8);
    return {all.substr(8, n), all.substr(8 + n)};
  }
  void write(const std::string& path) const {
    const uint64_t n = header.size();
    write_file(path, std::string(reinterpret_cast<const char*>(&n), 8) + header + data);
  }
  nlohmann::ordered_json json() const { return nlohmann::ordered_json::parse(header); }
};

// ---------------------------------------------------------------------------------------
// A model directory broken one way per case, then evaluated (and sampled from).

struct Breakage {
  std::string name;
  std::function<void(const std::string& ckpt)> apply;
  std::vector<std::string> needles;
};
void PrintTo(const Breakage& b, std::ostream* os) { *os << b.name; }

class BrokenModel : public ::testing::TestWithParam<Breakage> {
 protected:
  void SetUp() override {
    LlamaModel model(tiny_config(BottleneckKind::cola));
    model.init_weights(1);
    save_model(model, dir / "ckpt");
    write_random_shard(dir / "val.bin", 2 * 16 + 1, 64, 1);
  }
  CommandResult eval() const {
    return run10(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16",
                             bottle_binary(), dir / "ckpt", dir / "val.bin"));
  }
  TempDir dir;
};

// Rewrites config.json through `edit`.
std::function<void(const std::string&)> config_edit(
    std::function<void(nlohmann::ordered_json&)> edit) {
  return [edit](const std::string& ckpt) {
    const std::string path = ckpt + "/config.json";
    auto j = nlohmann::ordered_json::parse(read_file(path));
    edit(j);
    write_file(path, j.dump(2));
  };
}

std::function<void(const std::string&)> config_set(const std::string& key,
                                                   const nlohmann::ordered_json& value) {
  return config_edit([key, value](nlohmann::ordered_json& j) { j[key] = value; });
}

// Rewrites config.json's text: `from` (its first occurrence) becomes `to`.
std::function<void(const std::string&)> config_text(const std::string& from,
                                                    const std::string& to) {
  return [from, to](const std::string& ckpt) {
    const std::string path = ckpt + "/config.json";
    std::string text = read_file(path);
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << text;
    text.replace(at, from.size(), to);
    write_file(path, text);
  };
}

// Rewrites model.safetensors through `edit`.
std::function<void(const std::string&)> weights_edit(std::function<void(SafeTensorsFile&)> edit) {
  return [edit](const std::string& ckpt) {
    const std::string path = ckpt + "/model.safetensors";
    SafeTensorsFile f = SafeTensorsFile::read(path);
    edit(f);
    f.write(path);
  };
}

// Sets element 3 of tensor `name` to `value`.
std::function<void(const std::string&)> poison(const std::string& name, float value) {
  return weights_edit([name, value](SafeTensorsFile& f) {
    const uint64_t begin = f.json().at(name).at("data_offsets")[0].get<uint64_t>();
    std::memcpy(f.data.data() + begin + 3 * sizeof(float), &value, sizeof(float));
  });
}

// Every value of tensor `name` pushed to ±3e38: finite weights whose products overflow.
std::function<void(const std::string&)> blow_up(const std::string& name) {
  return weights_edit([name](SafeTensorsFile& f) {
    const auto offsets = f.json().at(name).at("data_offsets");
    for (uint64_t at = offsets[0].get<uint64_t>(); at < offsets[1].get<uint64_t>(); at += 4) {
      float x = 0;
      std::memcpy(&x, f.data.data() + at, 4);
      x = std::copysign(3e38f, x);
      std::memcpy(f.data.data() + at, &x, 4);
    }
  });
}

// model.safetensors moved to one shard listed by an index whose weight_map is `edit`ed.
std::function<void(const std::string&)> index_edit(
    std::function<void(nlohmann::ordered_json&)> edit, bool keep_single = false) {
  return [edit, keep_single](const std::string& ckpt) {
    const fs::path shard = fs::path(ckpt) / "model-00001-of-00001.safetensors";
    fs::copy_file(ckpt + "/model.safetensors", shard);
    if (!keep_single) fs::remove(ckpt + "/model.safetensors");
    nlohmann::ordered_json map = nlohmann::ordered_json::object();
    const auto header = SafeTensorsFile::read(shard.string()).json();
    for (const auto& [name, entry] : header.items())
      if (name != "__metadata__") map[name] = shard.filename().string();
    edit(map);
    write_file(ckpt + "/model.safetensors.index.json",
               nlohmann::ordered_json{{"weight_map", map}}.dump(2));
  };
}

constexpr const char* kEmbed = "model.embed_tokens.weight";
constexpr const char* kNorm = "model.norm.weight";

TEST_P(BrokenModel, IsRefusedByName) {
  GetParam().apply(dir / "ckpt");
  expect_refused(eval(), GetParam().needles);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BrokenModel,
    ::testing::Values(
        // Case 1 and 12: sizes that are not integers, or whose products overflow.
        Breakage{"hidden_size_fraction",
                 config_set("hidden_size", 64.5),
                 {"config.json", "'hidden_size'", "must be an integer in [1, 9223372036854775807]",
                  "64.5"}},
        Breakage{
            "hidden_size_2e19",
            config_set("hidden_size", 2e19),
            {"config.json", "'hidden_size'", "must be an integer in [1, 9223372036854775807]"}},
        Breakage{
            "hidden_size_2_pow_64",
            config_text("\"hidden_size\": 32", "\"hidden_size\": 18446744073709551615"),
            {"config.json", "'hidden_size'", "must be an integer in [1, 9223372036854775807]"}},
        Breakage{"hidden_size_overflows",
                 config_edit([](auto& j) {
                   j["hidden_size"] = int64_t(4611686018427387904);
                   j["bottleneck"]["rank"] = 8;
                 }),
                 {"config.json", "too large", "vocab_size x hidden_size"}},
        Breakage{"intermediate_size_overflows",
                 config_set("intermediate_size", int64_t(1) << 60),
                 {"config.json", "too large", "hidden_size x intermediate_size"}},
        Breakage{"layers_overflow",
                 config_set("num_hidden_layers", int64_t(1) << 60),
                 {"config.json", "too large", "num_hidden_layers"}},
        Breakage{"vocab_beyond_int32",
                 config_set("vocab_size", int64_t(1) << 32),
                 {"config.json", "vocab_size", "2147483647"}},
        Breakage{"rms_norm_eps_beyond_float",
                 config_set("rms_norm_eps", 1e300),
                 {"config.json", "rms_norm_eps"}},
        Breakage{"duplicate_config_key",
                 config_text("\"hidden_size\": 32", "\"hidden_size\": 32, \"hidden_size\": 64"),
                 {"config.json", "'hidden_size'", "more than once"}},
        // Case 9: config.json keys that change the model.
        Breakage{"hidden_act_gelu",
                 config_set("hidden_act", "gelu"),
                 {"config.json", "hidden_act", "gelu", "silu"}},
        Breakage{"rope_scaling",
                 config_set("rope_scaling", {{"type", "linear"}, {"factor", 2.0}}),
                 {"config.json", "rope_scaling"}},
        Breakage{"head_dim_mismatch",
                 config_set("head_dim", 16),
                 {"config.json", "head_dim", "16", "8"}},
        Breakage{"attention_bias",
                 config_set("attention_bias", true),
                 {"config.json", "attention_bias"}},
        Breakage{"mlp_bias", config_set("mlp_bias", true), {"config.json", "mlp_bias"}},
        Breakage{"model_type_mistral",
                 config_set("model_type", "mistral"),
                 {"config.json", "model_type", "mistral"}},
        Breakage{"architectures_other",
                 config_set("architectures", {"GPT2LMHeadModel"}),
                 {"config.json", "architectures", "GPT2LMHeadModel"}},
        // Case 9: malformed safetensors.
        Breakage{"duplicate_tensor",
                 weights_edit([](SafeTensorsFile& f) {
                   // A second entry for the final norm, pointing at the embedding's bytes.
                   const auto j = f.json();
                   const std::string extra = fmt::format(",\"{}\":{}}}", kNorm, j.at(kNorm).dump());
                   const size_t end = f.header.rfind('}');
                   f.header = f.header.substr(0, end) + extra;
                 }),
                 {"model.safetensors", kNorm, "more than once"}},
        Breakage{"overlapping_offsets",
                 weights_edit([](SafeTensorsFile& f) {
                   auto j = f.json();
                   // Two tensors of the same size: the second now reads the first's bytes.
                   std::string a, b;
                   for (const auto& [name, e] : j.items())
                     if (name.find("q_proj.A") != std::string::npos) (a.empty() ? a : b) = name;
                   j[b]["data_offsets"] = j[a]["data_offsets"];
                   f.header = j.dump();
                 }),
                 {"model.safetensors", "overlap", "q_proj.A"}},
        Breakage{"trailing_bytes",
                 weights_edit([](SafeTensorsFile& f) { f.data += std::string(64, 'x'); }),
                 {"model.safetensors", "belong to no tensor"}},
        // Case 11: non-finite weights.
        Breakage{
            "nan_weight", poison(kEmbed, NAN), {"model.safetensors", kEmbed, "non-finite", "nan"}},
        Breakage{"inf_weight",
                 poison(kNorm, INFINITY),
                 {"model.safetensors", kNorm, "non-finite", "inf"}},
        Breakage{"non_finite_loss", blow_up("lm_head.weight"), {"ckpt", "loss", "non-finite"}},
        // Case 9: sharded checkpoints.
        Breakage{"weight_map_parent_dir",
                 index_edit([](auto& map) { map[kEmbed] = "../model-00001-of-00001.safetensors"; }),
                 {"model.safetensors.index.json", kEmbed, "'..", "file name"}},
        Breakage{"weight_map_absolute",
                 index_edit([](auto& map) { map[kEmbed] = "/etc/passwd"; }),
                 {"model.safetensors.index.json", kEmbed, "/etc/passwd"}},
        Breakage{"single_file_and_index",
                 index_edit([](auto&) {}, /*keep_single=*/true),
                 {"model.safetensors", "model.safetensors.index.json", "both"}}),
    [](const auto& info) { return info.param.name; });

// The sharded layout the index cases break is itself fine: the errors above are theirs.
TEST(ShardedModel, AGoodIndexEvaluates) {
  TempDir dir;
  LlamaModel model(tiny_config(BottleneckKind::cola));
  model.init_weights(1);
  save_model(model, dir / "ckpt");
  write_random_shard(dir / "val.bin", 2 * 16 + 1, 64, 1);
  index_edit([](auto&) {})(dir / "ckpt");
  const CommandResult r = run10(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16",
                                            bottle_binary(), dir / "ckpt", dir / "val.bin"));
  EXPECT_EQ(r.status, 0) << r.output;
}

TEST(NonFiniteWeights, SampleRefusesThem) {
  TempDir dir;
  ModelConfig c = tiny_config(BottleneckKind::none);
  c.vocab_size = 256;  // byte-level prompts
  LlamaModel model(c);
  model.init_weights(1);
  save_model(model, dir / "ckpt");
  poison("lm_head.weight", NAN)(dir / "ckpt");
  expect_refused(run10(fmt::format("{} sample --checkpoint {} --prompt ab --tokens 3",
                                   bottle_binary(), dir / "ckpt")),
                 {"model.safetensors", "lm_head.weight", "non-finite"});
}

TEST(NonFiniteLogits, SampleRefusesThem) {
  TempDir dir;
  ModelConfig c = tiny_config(BottleneckKind::none);
  c.vocab_size = 256;
  LlamaModel model(c);
  model.init_weights(1);
  save_model(model, dir / "ckpt");
  blow_up("lm_head.weight")(dir / "ckpt");
  expect_refused(run10(fmt::format("{} sample --checkpoint {} --prompt ab --tokens 3",
                                   bottle_binary(), dir / "ckpt")),
                 {dir / "ckpt", "non-finite logits"});
}

TEST(BadTokens, EvalNamesTheShard) {
  TempDir dir;
  LlamaModel model(tiny_config(BottleneckKind::cola));
  model.init_weights(1);
  save_model(model, dir / "ckpt");
  std::vector<int32_t> tokens(2 * 16 + 1, 5);
  tokens[7] = 64;  // the vocabulary is [0, 64)
  write_token_shard(dir / "val.bin", tokens);
  expect_refused(run10(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16",
                                   bottle_binary(), dir / "ckpt", dir / "val.bin")),
                 {dir / "val.bin", "token id 64"});
}

TEST(CheckpointPath, SymlinkLoopIsNamed) {
  TempDir dir;
  fs::create_symlink(dir / "loop", dir / "loop");
  write_random_shard(dir / "val.bin", 2 * 16 + 1, 64, 1);
  expect_refused(run10(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16",
                                   bottle_binary(), dir / "loop", dir / "val.bin")),
                 {dir / "loop", "symbolic links"});
}

// ---------------------------------------------------------------------------------------
// Training checkpoints: one tiny run (steps 1 and 2 saved) made once, copied per test.

class Run : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    made_ = std::make_unique<TempDir>();
    write_random_shard(*made_ / "train.bin", 2000, 64, 1);
    write_random_shard(*made_ / "val.bin", 200, 64, 2);
    write_toml(*made_ / "tiny.toml", *made_ / "train.bin", *made_ / "val.bin", *made_ / "run");
    const CommandResult r = run(fmt::format("{} train {}", bottle_binary(), *made_ / "tiny.toml"));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  static void TearDownTestSuite() { made_.reset(); }

  void SetUp() override {
    ASSERT_TRUE(fs::exists(*made_ / "run/step_00000002/trainer_state.json"));
    fs::copy(made_->str(), dir.str(), fs::copy_options::recursive);
    write_toml(dir / "tiny.toml", dir / "train.bin", dir / "val.bin", dir / "run");
  }

  static void write_toml(const std::string& path, const std::string& train, const std::string& val,
                         const std::string& folder) {
    std::ofstream(path) << kTinyColaModelToml
                        << fmt::format(R"([training]
steps = 2
micro_batch_size = 2
seq_len = 16
eval_interval = 0

[data]
train = "{}"
val = "{}"

[checkpoint]
folder = "{}"
interval = 1
keep = 3
)",
                                       train, val, folder);
  }

  CommandResult train(const std::string& args) const {
    return run10(fmt::format("{} train {} {}", bottle_binary(), dir / "tiny.toml", args));
  }
  std::string state_path(int step = 2) const {
    return dir / fmt::format("run/step_{:08d}/trainer_state.json", step);
  }

  static inline std::unique_ptr<TempDir> made_;
  TempDir dir;
};

// Issue 57, case 2: a sharded checkpoint's index is input like any other. A piece's file with a
// directory, a piece taken away (the tensor no longer covered), one outside its tensor and a
// piece's key missing from its file: each one error naming the index (or the file) and the
// tensor, for --resume, eval and export alike; the untouched checkpoint reads.
TEST_F(Run, DamagedShardedIndexIsRefusedByName) {
  const std::string ckpt = dir / "run/step_00000002", index = ckpt + "/checkpoint_index.json";
  const std::string original = [&] {
    std::ifstream in(index);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }();
  auto with_index = [&](const std::function<void(nlohmann::json&)>& edit) {
    nlohmann::json j = nlohmann::json::parse(original);
    edit(j);
    std::ofstream(index, std::ios::trunc) << j.dump();
  };
  auto norm = [](nlohmann::json& j) -> nlohmann::json& {
    for (auto& t : j["tensors"])
      if (t["name"] == "model.norm.weight") return t;
    throw std::runtime_error("no model.norm.weight in the index");
  };
  const std::string eval = fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16",
                                       bottle_binary(), ckpt, dir / "val.bin");
  with_index(
      [&](nlohmann::json& j) { norm(j)["pieces"][0]["file"] = "../rank-00000.safetensors"; });
  expect_refused(run10(eval), {index, "model.norm.weight", "'../rank-00000.safetensors'",
                               "file name"});
  with_index([&](nlohmann::json& j) { norm(j)["pieces"] = nlohmann::json::array(); });
  expect_refused(run10(eval), {index, "model.norm.weight", "hold 0 of the 32 elements",
                               "incomplete or damaged"});
  expect_refused(train("--resume --set training.steps=3"), {index, "model.norm.weight"});
  expect_refused(run10(fmt::format("{} export --checkpoint {} --out {}", bottle_binary(), ckpt,
                                   dir / "out")),
                 {index, "model.norm.weight"});
  EXPECT_FALSE(fs::exists(dir / "out"));
  with_index([&](nlohmann::json& j) { norm(j)["pieces"][0]["range"][1] = 33; });
  expect_refused(run10(eval), {index, "model.norm.weight", "[0, 33) lies outside its slice of "
                                                           "32 elements"});
  with_index([&](nlohmann::json& j) { norm(j)["pieces"][0]["key"] = "model.norm.weight@1"; });
  expect_refused(run10(eval), {"rank-00000.safetensors", "model.norm.weight@1", index});
  std::ofstream(index, std::ios::trunc) << original;
  const CommandResult good = run10(eval);
  EXPECT_EQ(good.status, 0) << good.output;
}

// Issue 57, case 2: an asynchronous save (checkpoint.async) publishes the same checkpoint, byte
// for byte, as a synchronous one, and a run resumed from it goes on as the other does.
TEST_F(Run, AsyncSaveWritesTheSameCheckpoint) {
  const CommandResult a =
      train("--set checkpoint.folder=" + dir / "sync" + " --set training.steps=3");
  ASSERT_EQ(a.status, 0) << a.output;
  const CommandResult b = train("--set checkpoint.folder=" + dir / "async" +
                                " --set training.steps=3 --set checkpoint.async=true");
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NE(b.output.find(", being written in the background)"), std::string::npos) << b.output;
  auto bytes_of = [](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const int step : {1, 2, 3})
    for (const char* file : {"rank-00000.safetensors", "checkpoint_index.json"}) {
      const std::string name = fmt::format("step_{:08d}/{}", step, file);
      EXPECT_TRUE(bytes_of(dir / ("sync/" + name)) == bytes_of(dir / ("async/" + name))) << name;
    }
  // Every save was published: no temporary folder is left.
  for (const auto& e : fs::directory_iterator(dir / "async"))
    EXPECT_FALSE(e.path().filename().string().starts_with(".tmp-")) << e.path();
}

// Case 4: trainer_state.json validated field by field.
struct BadState {
  std::string name;
  std::function<void(nlohmann::json&)> edit;
  std::vector<std::string> needles;
};
void PrintTo(const BadState& b, std::ostream* os) { *os << b.name; }

class BadTrainerState : public Run, public ::testing::WithParamInterface<BadState> {};

TEST_P(BadTrainerState, ResumeIsRefusedByName) {
  auto j = nlohmann::json::parse(read_file(state_path()));
  GetParam().edit(j);
  write_file(state_path(), j.dump());
  std::vector<std::string> needles = GetParam().needles;
  needles.push_back("trainer_state.json");
  expect_refused(train("--resume --set training.steps=3"), needles);
  EXPECT_FALSE(fs::exists(dir / "run/step_00000003"));
}

INSTANTIATE_TEST_SUITE_P(
    Fields, BadTrainerState,
    ::testing::Values(
        BadState{"optimizer_steps_text",
                 [](auto& j) { j["optimizer_steps"] = "abc"; },
                 {"'optimizer_steps'", "\"abc\""}},
        BadState{"optimizer_steps_beyond_step",
                 [](auto& j) { j["optimizer_steps"] = 9; },
                 {"'optimizer_steps'", "[0, 2]"}},
        BadState{"step_negative", [](auto& j) { j["step"] = -5; }, {"'step'", "-5"}},
        BadState{"step_fraction", [](auto& j) { j["step"] = 1.5; }, {"'step'", "1.5"}},
        BadState{
            "step_not_the_directory", [](auto& j) { j["step"] = 1; }, {"'step'", "step_00000002"}},
        BadState{"step_missing", [](auto& j) { j.erase("step"); }, {"missing key 'step'"}},
        BadState{
            "position_wrong", [](auto& j) { j["train_position"] = "start"; }, {"train_position"}},
        BadState{"position_negative",
                 [](auto& j) { j["train_position"]["epoch"] = -1; },
                 {"train_position", "epoch"}},
        BadState{"not_an_object", [](auto& j) { j = nlohmann::json::array(); }, {"JSON object"}}),
    [](const auto& info) { return info.param.name; });

TEST_F(Run, DuplicateStateKeyIsRefused) {
  std::string text = read_file(state_path());
  const size_t at = text.find('{');
  text.insert(at + 1, "\"step\": 2, ");
  write_file(state_path(), text);
  expect_refused(train("--resume --set training.steps=3"),
                 {"trainer_state.json", "'step'", "more than once"});
}

// Case 7: export never writes into an existing checkpoint or a non-empty folder.
TEST_F(Run, ExportOverACheckpointIsRefused) {
  const std::string target = dir / "run/step_00000001";
  const std::string before = read_file(target + "/rank-00000.safetensors");
  const CommandResult r = run10(fmt::format("{} export --checkpoint {} --out {}", bottle_binary(),
                                            dir / "run/step_00000002", target));
  expect_refused(r, {"step_00000001", "not empty"});
  EXPECT_EQ(read_file(target + "/rank-00000.safetensors"), before);
}

TEST_F(Run, ExportIntoANonEmptyFolderIsRefused) {
  fs::create_directories(dir / "out");
  write_file(dir / "out/notes.txt", "mine");
  expect_refused(run10(fmt::format("{} export --checkpoint {} --out {}", bottle_binary(),
                                   dir / "run/step_00000002", dir / "out")),
                 {dir / "out", "not empty"});
  EXPECT_FALSE(fs::exists(dir / "out/config.json"));
}

TEST_F(Run, ExportIntoAnEmptyFolderWorks) {
  fs::create_directories(dir / "out");
  const CommandResult r = run10(fmt::format("{} export --checkpoint {} --out {}", bottle_binary(),
                                            dir / "run/step_00000002", dir / "out"));
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(fs::exists(dir / "out/model.safetensors"));
}

// Case 10: what resume uses and skips is said; a finished run is said to be complete.
TEST_F(Run, ResumeSaysWhichNewerCheckpointItSkips) {
  fs::copy(dir / "run/step_00000002", dir / "run/step_00000003", fs::copy_options::recursive);
  fs::remove(dir / "run/step_00000003/trainer_state.json");
  const CommandResult r = train("--resume --set training.steps=4");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("skipped " + dir / "run/step_00000003"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("trainer_state.json"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir / "run/step_00000002 at step 2"), std::string::npos)
      << r.output;
}

TEST_F(Run, ResumingAFinishedRunSaysItIsComplete) {
  const CommandResult r = train("--resume");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("already complete"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("step_00000002"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("loss"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("done:"), std::string::npos) << r.output;
}

TEST_F(Run, ResumingPastTrainingStepsIsRefused) {
  expect_refused(train("--resume --set training.steps=1"), {"training.steps", "step_00000002"});
}

// Case 12: a bad token in the validation shard names that shard.
TEST_F(Run, BadValidationTokenNamesTheShard) {
  std::vector<int32_t> tokens(200, 3);
  tokens[10] = 99;
  write_token_shard(dir / "bad_val.bin", tokens);
  expect_refused(train(fmt::format(
                     "--set checkpoint.folder={} --set data.val={} --set training.eval_interval=1 "
                     "--set training.eval_batches=1",
                     dir / "fresh", dir / "bad_val.bin")),
                 {dir / "bad_val.bin", "token id 99"});
}

// Case 12: a checkpoint.folder that cannot hold checkpoints is named, not an internal error.
TEST_F(Run, FolderThatIsAFile) {
  write_file(dir / "file", "x");
  expect_refused(train(fmt::format("--set checkpoint.folder={}", dir / "file")),
                 {dir / "file", "checkpoint.folder", "not a directory"});
}

TEST_F(Run, FolderUnderAFile) {
  write_file(dir / "file", "x");
  expect_refused(train(fmt::format("--set checkpoint.folder={}", dir / "file/run")),
                 {dir / "file/run", "checkpoint.folder"});
}

TEST_F(Run, FolderThatIsASymlinkLoop) {
  fs::create_symlink(dir / "loop", dir / "loop");
  expect_refused(train(fmt::format("--set checkpoint.folder={}", dir / "loop")),
                 {dir / "loop", "checkpoint.folder"});
}

TEST_F(Run, FolderWithAReadOnlyParent) {
  if (::geteuid() == 0) {
    // Permission bits do not stop root; sysfs refuses new directories to everyone.
    expect_refused(train("--set checkpoint.folder=/sys/bottle-run"),
                   {"/sys/bottle-run", "checkpoint.folder cannot be created"});
    return;
  }
  fs::create_directories(dir / "ro");
  fs::permissions(dir / "ro", fs::perms::owner_read | fs::perms::owner_exec);
  const CommandResult r = train(fmt::format("--set checkpoint.folder={}", dir / "ro/run"));
  fs::permissions(dir / "ro", fs::perms::owner_all);
  expect_refused(r, {dir / "ro", "checkpoint.folder", "not writable"});
}

// ---------------------------------------------------------------------------------------
// Issue 29, rule 4: a run's outputs never overwrite its inputs or each other, and nothing that
// is not the run's own is deleted.

// step_00000002 copied as `name` with its trainer_state.json's step set to `step`.
void copy_step(const std::string& run, const std::string& name, int64_t step) {
  fs::copy(run + "/step_00000002", run + "/" + name, fs::copy_options::recursive);
  const std::string state = run + "/" + name + "/trainer_state.json";
  auto j = nlohmann::json::parse(read_file(state));
  j["step"] = step;
  write_file(state, j.dump(2));
}

// The names in `folder`, but the lock file a refused run may leave (it blocks nobody).
std::vector<std::string> entries_of(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(folder))
    if (e.path().filename() != ".bottle.lock") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

// Step folders are ordered by their number: resume takes the newest, keep = 1 keeps it.
TEST_F(Run, StepFoldersAreOrderedByTheirNumber) {
  struct Case {
    std::vector<std::pair<std::string, int64_t>> copies;  // (name, step)
    std::string newest;
    int64_t step;
  };
  for (const Case& c : {Case{{{"step_99999999", 99999999}, {"step_100000000", 100000000}},
                             "step_100000000",
                             100000000},
                        Case{{{"step_9", 9}, {"step_10", 10}}, "step_10", 10},
                        Case{{{"step_00000999", 999}, {"step_1000", 1000}}, "step_1000", 1000}}) {
    SCOPED_TRACE(c.newest);
    const std::string run = dir / ("order_" + c.newest);
    fs::create_directories(run);
    fs::copy(dir / "run/step_00000002", run + "/step_00000002", fs::copy_options::recursive);
    for (const auto& [name, step] : c.copies) copy_step(run, name, step);
    fs::remove_all(run + "/step_00000002");
    const CommandResult r = train(fmt::format(
        "--resume --set checkpoint.folder={} --set checkpoint.keep=1 --set training.steps={}", run,
        c.step + 1));
    EXPECT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find(fmt::format("resumed from {}/{} at step {}", run, c.newest, c.step)),
              std::string::npos)
        << r.output;
    // The new checkpoint is the newest, so it alone is kept.
    std::vector<std::string> steps;
    for (const std::string& name : entries_of(run))
      if (name.rfind("step_", 0) == 0) steps.push_back(name);
    EXPECT_EQ(steps, std::vector<std::string>{fmt::format("step_{:08d}", c.step + 1)});
  }
}

// A folder named like a step that bottle did not write is refused by name and left alone,
// whether the run starts fresh or resumes.
TEST_F(Run, ForeignStepFoldersAreRefusedAndKept) {
  struct Foreign {
    std::string name;
    std::function<void(const std::string& path)> make;
    std::string why;
  };
  const std::vector<Foreign> cases = {
      {"step_00000025",
       [](const std::string& p) {
         fs::create_directories(p);
         write_file(p + "/notes.txt", "mine");
       },
       "it has neither bottle_checkpoint nor trainer_state.json"},
      {"step_00000003", [](const std::string& p) { write_file(p, "a file"); },
       "it is not a directory"},
      {"step_00000004",
       [](const std::string& p) {
         fs::create_directories(p);
         write_file(p + "/trainer_state.json", "{\"mine\": true}");
       },
       "its trainer_state.json does not read"},
      {"step_00000005",
       [&](const std::string& p) { fs::create_directory_symlink(dir / "run/step_00000002", p); },
       "it is a symbolic link"}};
  for (const Foreign& f : cases) {
    for (const std::string& mode : {std::string("--resume --set training.steps=3"),
                                    fmt::format("--set checkpoint.folder={}", dir / "fresh")}) {
      SCOPED_TRACE(f.name + " " + mode);
      const std::string folder =
          mode.find("--resume") != std::string::npos ? dir / "run" : dir / "fresh";
      fs::create_directories(folder);
      const std::string path = folder + "/" + f.name;
      f.make(path);
      const std::vector<std::string> before = entries_of(folder);
      expect_refused(train(mode), {path, "bottle did not write it", f.why, "move or rename it"});
      EXPECT_EQ(entries_of(folder), before);
      EXPECT_TRUE(fs::exists(fs::symlink_status(path)));
      fs::remove_all(fs::path(path));  // the symlink itself, not its target
    }
  }
  EXPECT_TRUE(fs::exists(dir / "run/step_00000002/checkpoint_index.json"));
}

// Names that are not a step folder's (a copy, a backup) are ignored: never resumed from, never
// pruned.
TEST_F(Run, CopiesOfStepFoldersAreIgnored) {
  for (const std::string name :
       {"step_00000010.bak", "step_00000010 copy", "old_step_00000010", "step_", "step_1e3"})
    fs::copy(dir / "run/step_00000002", dir / ("run/" + name), fs::copy_options::recursive);
  const CommandResult r = train("--resume --set training.steps=4 --set checkpoint.keep=1");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir / "run/step_00000002 at step 2"), std::string::npos)
      << r.output;
  for (const std::string name :
       {"step_00000010.bak", "step_00000010 copy", "old_step_00000010", "step_", "step_1e3"})
    EXPECT_TRUE(fs::exists(dir / ("run/" + name + "/checkpoint_index.json"))) << name;
  EXPECT_FALSE(fs::exists(dir / "run/step_00000002"));
  EXPECT_TRUE(fs::exists(dir / "run/step_00000004/bottle_checkpoint"));
}

// Checkpoints written before the marker existed are ours by their trainer_state.json: they
// resume, and are pruned as the run's own.
TEST_F(Run, CheckpointsWithoutTheMarkerStillResume) {
  for (const char* step : {"step_00000001", "step_00000002"}) {
    ASSERT_TRUE(fs::remove(dir / fmt::format("run/{}/bottle_checkpoint", step)));
  }
  const CommandResult r = train("--resume --set training.steps=3 --set checkpoint.keep=2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir / "run/step_00000002 at step 2"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(dir / "run/step_00000001"));
  EXPECT_TRUE(fs::exists(dir / "run/step_00000003/bottle_checkpoint"));
}

// Issue 45, case 1: a run killed while it prunes an old checkpoint leaves nothing that a later
// --resume refuses. The failpoint kills the run once the pruned folder has lost its marker and
// trainer_state.json (deleting a folder goes file by file, in the directory's order): before the
// fix that left step_00000001 without them, and every later resume refused it as "bottle did
// not write it".
TEST_F(Run, AKillWhilePruningLeavesAFolderThatResumes) {
  const CommandResult killed =
      run10(fmt::format("env BOTTLE_FAILPOINT=checkpoint_prune {} train {} --resume --set "
                        "training.steps=3 --set checkpoint.keep=2",
                        bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(killed.status, 128 + SIGKILL) << killed.output;
  ASSERT_TRUE(fs::exists(dir / "run/step_00000003/trainer_state.json")) << killed.output;
  const CommandResult r = train("--resume --set training.steps=4 --set checkpoint.keep=2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("resumed from " + dir / "run/step_00000003 at step 3"), std::string::npos)
      << r.output;
  // The interrupted deletion is finished by the next save: only the two newest remain.
  std::vector<std::string> left;
  for (const std::string& name : entries_of(dir / "run"))
    if (name.starts_with("step_") || name.starts_with(".")) left.push_back(name);
  EXPECT_EQ(left, (std::vector<std::string>{"step_00000003", "step_00000004"}));
}

// Issue 45, case 6: a checkpoint records each source's shards (name, bytes, tokens) and
// --resume compares them with what data.train holds now. Before, only the spelling of
// data.train was compared: a shard added under the same glob, one rewritten in place or a
// mixture source changed resumed silently at a position of another window order, and the same
// shards moved elsewhere were refused because the old path no longer held them.
TEST_F(Run, ResumeComparesTheShardsItWasTrainedOn) {
  fs::create_directories(dir / "shards");
  write_random_shard(dir / "shards/a.bin", 1500, 64, 11);
  write_random_shard(dir / "shards/b.bin", 1500, 64, 12);
  write_random_shard(dir / "other.bin", 1500, 64, 13);
  const std::string glob = dir / "shards/*.bin";
  const std::string one = "--set checkpoint.folder=" + dir / "one --set data.train=" + glob;
  const CommandResult first = train(one);
  ASSERT_EQ(first.status, 0) << first.output;
  const auto state = nlohmann::json::parse(read_file(dir / "one/step_00000002/trainer_state.json"));
  EXPECT_EQ(state.at("data_shards").dump(),
            fmt::format(R"([{{"shards":[{{"bytes":4024,"name":"a.bin","tokens":1500}},)"
                        R"({{"bytes":4024,"name":"b.bin","tokens":1500}}],"source":"{}"}}])",
                        glob));
  const std::string ckpt = dir / "one/step_00000002";
  // A shard added under the same glob.
  write_random_shard(dir / "shards/c.bin", 1500, 64, 14);
  expect_refused(train(one + " --resume --set training.steps=3"),
                 {"--resume", ckpt, "whose shards differ", "source 1",
                  "added c.bin (4024 bytes, "
                  "1500 tokens)",
                  "--init-from " + ckpt});
  fs::remove(dir / "shards/c.bin");
  // A shard rewritten smaller in place.
  write_random_shard(dir / "shards/b.bin", 1000, 64, 12);
  expect_refused(train(one + " --resume --set training.steps=3"),
                 {"source 1", "rewrote b.bin: 4024 bytes and 1500 tokens, now 3024 and 1000"});
  // A shard removed.
  fs::remove(dir / "shards/b.bin");
  expect_refused(train(one + " --resume --set training.steps=3"),
                 {"source 1", "removed b.bin (4024 bytes, 1500 tokens)"});
  EXPECT_FALSE(fs::exists(dir / "one/step_00000003"));
  // The same shards moved to another directory: kept, and said.
  write_random_shard(dir / "shards/b.bin", 1500, 64, 12);
  fs::rename(dir / "shards", dir / "moved");
  const CommandResult moved = train("--set checkpoint.folder=" + dir / "one --set data.train=" +
                                    dir / "moved/*.bin --resume --set training.steps=3");
  ASSERT_EQ(moved.status, 0) << moved.output;
  EXPECT_NE(moved.output.find("the same shards by name, size and token count, so the saved "
                              "position"),
            std::string::npos)
      << moved.output;
  // A mixture whose second source is rewritten.
  const std::string mixture =
      fmt::format("--set checkpoint.folder={} --set 'data.train=[\"{}\", \"{}\"]'", dir / "two",
                  dir / "moved/*.bin", dir / "other.bin");
  const CommandResult mixed = train(mixture);
  ASSERT_EQ(mixed.status, 0) << mixed.output;
  write_random_shard(dir / "other.bin", 1400, 64, 13);
  expect_refused(train(mixture + " --resume --set training.steps=3"),
                 {"source 2 (\"" + dir / "other.bin", "rewrote other.bin"});
  // A checkpoint of an older bottle, without the record: compared by spelling, and said.
  write_random_shard(dir / "other.bin", 1500, 64, 13);
  const std::string old_state = dir / "two/step_00000002/trainer_state.json";
  auto j = nlohmann::json::parse(read_file(old_state));
  j.erase("data_shards");
  write_file(old_state, j.dump());
  const CommandResult old = train(mixture + " --resume --set training.steps=3");
  ASSERT_EQ(old.status, 0) << old.output;
  EXPECT_NE(old.output.find("records no list of its shards"), std::string::npos) << old.output;
}

std::vector<std::string> entries_under(const std::string& dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out.push_back(fs::relative(e.path(), dir).string());
  std::sort(out.begin(), out.end());
  return out;
}

// Issue 45, case 4: export, lowrank and plot on a disk that fills write their output whole or
// not at all: the error names what failed and says the partial copy was removed, nothing is
// left, and the same command succeeds once there is room. Before, export and lowrank left
// config.json, the modeling files and a cut model.safetensors (the retry refused as "not
// empty"), and plot left a cut PNG and exited 0.
TEST_F(Run, OutputsOnAFullDiskAreWholeOrAbsent) {
  // A dense model for lowrank, and the sizes of what each command writes.
  ModelConfig dense = tiny_config(BottleneckKind::none);
  LlamaModel model(dense);
  model.init_weights(3);
  save_model(model, dir / "dense");
  auto export_to = [&](const std::string& out) {
    return fmt::format("{} export --checkpoint {} --out {}", bottle_binary(), dir / "run", out);
  };
  auto lowrank_to = [&](const std::string& out) {
    return fmt::format("{} lowrank --from {} --kind cola --rank 4 --out {}", bottle_binary(),
                       dir / "dense", out);
  };
  auto plot_to = [&](const std::string& out) {
    return fmt::format("{} plot {} --out {}", bottle_binary(), dir / "run/metrics.jsonl", out);
  };
  ASSERT_EQ(run10(export_to(dir / "e")).status, 0);
  ASSERT_EQ(run10(lowrank_to(dir / "l")).status, 0);
  ASSERT_EQ(run10(plot_to(dir / "p.png")).status, 0);
  const int64_t weights = int64_t(fs::file_size(dir / "e/model.safetensors"));
  const int64_t low_weights = int64_t(fs::file_size(dir / "l/model.safetensors"));
  ASSERT_GT(weights, 16384);
  ASSERT_GT(low_weights, 16384);
  // Room for the small files (a page each) and half of the weights.
  auto pages = [](int64_t bytes) { return (bytes + 4095) / 4096 * 4096; };
  int64_t small = 0;
  for (const std::string& name : entries_under(dir / "e"))
    if (name != "model.safetensors") small += pages(int64_t(fs::file_size(dir / ("e/" + name))));
  SmallDisk disk(dir / "disk", small + pages(std::min(weights, low_weights) / 2));
  if (!disk.mounted()) GTEST_SKIP() << disk.why();
  struct Output {
    std::string name, command, failing_file;
  };
  const std::vector<Output> outputs = {
      {"export", export_to(dir / "disk/model"), "model.safetensors"},
      {"lowrank", lowrank_to(dir / "disk/low"), "model.safetensors"},
  };
  for (const Output& o : outputs) {
    SCOPED_TRACE(o.name);
    const CommandResult r = run10(o.command);
    expect_refused(r, {o.failing_file, "(the partial copy " + dir / "disk/.", "was removed)",
                       "was not written", "can be run again"});
    EXPECT_EQ(entries_under(dir / "disk"), std::vector<std::string>{}) << r.output;
  }
  // The plot: its scratch files fit, its image does not.
  const int64_t png = int64_t(fs::file_size(dir / "p.png"));
  ASSERT_GT(png, 8192);
  ASSERT_NO_FATAL_FAILURE(disk.resize(pages(png / 2) + 3 * 4096));
  const CommandResult cut = run10(plot_to(dir / "disk/loss.png"));
  expect_refused(cut, {dir / "disk/.loss.png.partial-", "was removed)", "was not written"});
  EXPECT_EQ(entries_under(dir / "disk"), std::vector<std::string>{}) << cut.output;
  // With room, the same commands succeed where they failed.
  ASSERT_NO_FATAL_FAILURE(disk.resize(64 << 20));
  for (const Output& o : outputs) {
    SCOPED_TRACE(o.name + " again");
    const CommandResult r = run10(o.command);
    EXPECT_EQ(r.status, 0) << r.output;
  }
  const CommandResult drawn = run10(plot_to(dir / "disk/loss.png"));
  EXPECT_EQ(drawn.status, 0) << drawn.output;
  EXPECT_EQ(
      entries_under(dir / "disk"),
      (std::vector<std::string>{"loss.png", "low", "low/config.json", "low/configuration_bottle.py",
                                "low/model.safetensors", "low/modeling_bottle.py", "model",
                                "model/config.json", "model/configuration_bottle.py",
                                "model/model.safetensors", "model/modeling_bottle.py"}));
}

// Every file and folder under `dir` (hidden ones included) with its bytes; a folder has none.
std::map<std::string, std::string> files_under(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    out[fs::relative(e.path(), dir).string()] = e.is_regular_file() ? read_file(e.path()) : "";
  return out;
}

// The same names, then the same bytes (compared apart: a shard's bytes would flood the log).
void expect_same_files(const std::map<std::string, std::string>& now,
                       const std::map<std::string, std::string>& before) {
  std::vector<std::string> now_names, before_names;
  for (const auto& [name, _] : now) now_names.push_back(name);
  for (const auto& [name, _] : before) before_names.push_back(name);
  ASSERT_EQ(now_names, before_names);
  for (const auto& [name, bytes] : before) EXPECT_TRUE(now.at(name) == bytes) << name << " changed";
}

// Bytes a file system holds in use (a tmpfs counts its files' pages).
int64_t used_bytes(const std::string& path) {
  struct statvfs v {};
  EXPECT_EQ(::statvfs(path.c_str(), &v), 0) << path;
  return int64_t(v.f_blocks - v.f_bfree) * int64_t(v.f_frsize);
}

// Issue 45: `bottle prepare --output DIR` on a disk that fills leaves the earlier data set in
// DIR exactly as it was, whether the disk fills while the shards stream in or later, while
// the tokenizer is saved; the error names the file and says DIR is unchanged, and the same
// command succeeds once there is room. Before, the train split's shards and description were
// renamed into place and the earlier tokenizer removed before the tokenizer was written, so a
// full disk then left the new shards beside no tokenizer at all.
TEST(Prepare, OnAFullDiskLeavesTheEarlierDataSet) {
  TempDir dir;
  // A tiktoken rank file: the 256 bytes, then every pair of ASCII letters; its saved copy
  // (the rank file and a tokenizer.json of 2,960 ids and their merges) spans many pages.
  std::string ranks;
  int rank = 0;
  for (int b = 0; b < 256; ++b)
    ranks += fmt::format("{} {}\n", base64(std::string(1, char(b))), rank++);
  const std::string letters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  for (char a : letters)
    for (char b : letters) ranks += fmt::format("{} {}\n", base64(std::string{a, b}), rank++);
  write_file(dir / "ranks.tiktoken", ranks);
  const std::vector<std::string> words = {"the",  "quick", "brown", "fox", "jumps",
                                          "over", "lazy",  "dogs",  "and", "cats"};
  write_file(dir / "small.txt", sentences_of(words, 1, 2000));
  write_file(dir / "large.txt", sentences_of(words, 2, 200000));
  const std::string out = dir / "disk/out";
  auto prepare = [&](const std::string& input) {
    return run10(
        fmt::format("{} prepare --input {} --output {} --tokenizer {} --documents line "
                    "--val-fraction 0.1 --no-progress",
                    bottle_binary(), input, out, dir / "ranks.tiktoken"));
  };
  auto pages = [](int64_t bytes) { return (bytes + 4095) / 4096 * 4096; };

  SmallDisk disk(dir / "disk", 512 << 10);
  if (!disk.mounted()) GTEST_SKIP() << disk.why();
  const CommandResult first = prepare(dir / "small.txt");
  ASSERT_EQ(first.status, 0) << first.output;
  const auto small_set = files_under(out);
  int64_t tokenizer_bytes = 0, small_split_bytes = 0;
  for (const auto& [name, bytes] : small_set)
    (name.starts_with("tokenizer/") ? tokenizer_bytes : small_split_bytes) +=
        pages(int64_t(bytes.size()));
  ASSERT_GT(tokenizer_bytes, 16 * 4096);  // far more than case 2 leaves room for

  // 1. The shards do not fit: the disk fills while they stream in.
  const CommandResult cut = prepare(dir / "large.txt");
  expect_refused(cut, {out + "/data_", ".bin.tmp: write failed: No space left on device",
                       "; the earlier output in " + out + " is unchanged"});
  EXPECT_EQ(count_occurrences(cut.output, "bottle: error:"), 1) << cut.output;
  expect_same_files(files_under(out), small_set);
  ASSERT_NO_FATAL_FAILURE(disk.resize(16 << 20));
  const CommandResult large = prepare(dir / "large.txt");
  ASSERT_EQ(large.status, 0) << large.output;
  const auto large_set = files_under(out);

  // 2. The shards and descriptions fit, the tokenizer's copy does not: room for the small
  // data set's splits, the lock file and a page, none for its tokenizer's many pages.
  ASSERT_NO_FATAL_FAILURE(disk.resize(used_bytes(dir / "disk") + small_split_bytes + 2 * 4096));
  const CommandResult late = prepare(dir / "small.txt");
  expect_refused(
      late, {out + "/.tokenizer.partial-", "/.tokenizer.tiktoken.partial-",
             ": write failed (disk full?)", "; the earlier output in " + out + " is unchanged"});
  EXPECT_EQ(count_occurrences(late.output, "bottle: error:"), 1) << late.output;
  expect_same_files(files_under(out), large_set);

  // With room, the same command succeeds and gives the first data set again.
  ASSERT_NO_FATAL_FAILURE(disk.resize(16 << 20));
  const CommandResult again = prepare(dir / "small.txt");
  ASSERT_EQ(again.status, 0) << again.output;
  expect_same_files(files_under(out), small_set);
}

// --init-from X never has the run write into X, however X is spelled.
TEST_F(Run, InitFromIntoItselfIsRefused) {
  fs::copy(dir / "run/step_00000002", dir / "model", fs::copy_options::recursive);
  fs::remove(dir / "model/trainer_state.json");
  fs::remove(dir / "model/bottle_checkpoint");
  const std::vector<std::string> before = entries_of(dir / "model");
  for (const std::string& folder : {dir / "model", dir / "model/", dir / "./model"}) {
    SCOPED_TRACE(folder);
    expect_refused(
        train(fmt::format("--init-from {} --set checkpoint.folder={}", dir / "model", folder)),
        {"--init-from " + dir / "model", "is checkpoint.folder", "into its own input"});
    EXPECT_EQ(entries_of(dir / "model"), before);
  }
  // A checkpoint of the folder the run writes would be pruned or replaced by the run.
  expect_refused(train(fmt::format("--init-from {} --set checkpoint.folder={}",
                                   dir / "run/step_00000002", dir / "run")),
                 {"lies inside a checkpoint of checkpoint.folder"});
}

// metrics.jsonl and metrics.plot never name an input: --init-from's files, the tokenizer's, the
// run's own copy of its tokenizer.
TEST_F(Run, MetricsNamingAnInputAreRefused) {
  fs::copy(dir / "run/step_00000002", dir / "model", fs::copy_options::recursive);
  fs::create_directories(dir / "tokenizer");
  write_file(dir / "tokenizer/tokenizer.json", "{}");
  write_file(dir / "tokenizer/tokenizer_config.json", "{}");
  const std::string fresh = "--set checkpoint.folder=" + dir / "fresh";
  struct Case {
    std::string args, needle;
  };
  for (const Case& c :
       {Case{fmt::format("--init-from {} --set metrics.plot={}", dir / "model",
                         dir / "model/config.json"),
             "names a file of --init-from's model"},
        Case{fmt::format("--init-from {} --set metrics.jsonl={}", dir / "model",
                         dir / "model/rank-00000.safetensors"),
             "names a file of --init-from's model"},
        Case{fmt::format("--set metrics.plot={}", dir / "tokenizer/tokenizer.json"),
             "names a file of the run's tokenizer"},
        Case{fmt::format("--set metrics.jsonl={}", dir / "tokenizer/tokenizer_config.json"),
             "names a file of the run's tokenizer"},
        Case{"--set metrics.plot=tokenizer.json", "names the run's copy of its tokenizer"},
        Case{"--set metrics.jsonl=special_tokens_map.json",
             "names the run's copy of its tokenizer"}}) {
    SCOPED_TRACE(c.args);
    const std::string model_before = read_file(dir / "model/config.json");
    expect_refused(train(fresh + " " + c.args), {c.needle});
    EXPECT_EQ(read_file(dir / "model/config.json"), model_before);
    EXPECT_EQ(read_file(dir / "tokenizer/tokenizer.json"), "{}");
  }
  // data.tokenizer's folder is the tokenizer's too.
  expect_refused(
      train(fmt::format("{} --set data.tokenizer={} --set metrics.plot={}", fresh,
                        dir / "tokenizer/tokenizer.json", dir / "tokenizer/tokenizer_config.json")),
      {"names a file of the run's tokenizer"});
  // A checkpoint.folder that is the tokenizer's own directory would overwrite it.
  expect_refused(train(fmt::format("--set checkpoint.folder={}", dir / "tokenizer")),
                 {"is the directory of the run's tokenizer"});
}

// Case 1: a huge model width through the TOML configuration is refused at config time.
TEST_F(Run, HugeHiddenSizeInToml) {
  expect_refused(
      train(fmt::format("--set checkpoint.folder={} --set model.hidden_size=4611686018427387904",
                        dir / "fresh")),
      {"model.hidden_size", "too large"});
}

}  // namespace
}  // namespace bottle::testing
