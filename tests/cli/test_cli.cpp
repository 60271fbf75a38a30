// The bottle binary end to end: a checkpoint made outside bottle evaluates to PyTorch's loss,
// and every kind of bad input ends in one clear error naming the file, key or tensor, with
// exit status 1 — never a crash.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_util.h"

namespace bottle::testing {
namespace {

double json_loss(const CommandResult& r) {
  const size_t brace = r.output.rfind('{');
  EXPECT_NE(brace, std::string::npos) << r.output;
  return nlohmann::json::parse(r.output.substr(brace)).at("loss").get<double>();
}

struct External {
  std::string kind, extra;
};

class ExternalCheckpoint : public ::testing::TestWithParam<External> {};

TEST_P(ExternalCheckpoint, EvalGivesPyTorchsLoss) {
  TempDir dir;
  const External e = GetParam();
  const CommandResult create =
      run(fmt::format("{} --create {} --hidden 64 --intermediate 160 --layers 2 --heads 4 "
                      "--kv-heads 2 --vocab 256 --kind {} --rank 16 --seed 3 {}",
                      torch_reference(), dir / "ckpt", e.kind, e.extra));
  ASSERT_EQ(create.status, 0) << create.output;
  write_random_shard(dir / "val.bin", 4 * 2 * 32 + 1, 256, 5);
  const std::string args = fmt::format("--checkpoint {} --data {} --batch 2 --seq 32 --batches 4",
                                       dir / "ckpt", dir / "val.bin");
  const CommandResult ours = run(fmt::format("{} eval {} --json", bottle_binary(), args));
  ASSERT_EQ(ours.status, 0) << ours.output;
  const CommandResult theirs =
      run(fmt::format("{} {} --eval --dtype f64", torch_reference(), args));
  ASSERT_EQ(theirs.status, 0) << theirs.output;
  const double a = json_loss(ours), b = json_loss(theirs);
  EXPECT_LE(std::fabs(a - b) / b, 1e-5) << "bottle " << a << " vs PyTorch " << b;
  EXPECT_NE(ours.output.find("\"tokens\":256"), std::string::npos) << ours.output;
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, ExternalCheckpoint,
    ::testing::Values(External{"none", ""}, External{"none", "--tied"}, External{"svd", ""},
                      External{"cola", ""}, External{"lax", ""}, External{"cola", "--bf16"}),
    [](const auto& info) {
      return info.param.kind + (info.param.extra.empty() ? "" : "_" + info.param.extra.substr(2));
    });

// A good checkpoint to break in each test below.
class BadInput : public ::testing::Test {
 protected:
  void SetUp() override {
    LlamaModel model(tiny_config(BottleneckKind::cola));
    model.init_weights(1);
    save_model(model, dir / "ckpt");
    write_random_shard(dir / "val.bin", 2 * 16 + 1, 64, 1);
  }
  CommandResult eval() {
    return run(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16", bottle_binary(),
                           dir / "ckpt", dir / "val.bin"));
  }
  nlohmann::json config() {
    std::ifstream in(dir / "ckpt/config.json");
    return nlohmann::json::parse(in);
  }
  void write_config(const nlohmann::json& j) {
    std::ofstream(dir / "ckpt/config.json") << j.dump();
  }
  // One error line naming every `needle`, exit status 1.
  void expect_error(const std::vector<std::string>& needles) {
    const CommandResult r = eval();
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find("bottle: error:"), std::string::npos) << r.output;
    for (const std::string& n : needles)
      EXPECT_NE(r.output.find(n), std::string::npos) << "missing '" << n << "' in: " << r.output;
  }
  TempDir dir;
};

TEST_F(BadInput, GoodCheckpointEvaluates) { EXPECT_EQ(eval().status, 0); }

TEST_F(BadInput, HeadsNotDividingHidden) {
  auto j = config();
  j["num_attention_heads"] = 5;
  write_config(j);
  expect_error({"config.json", "num_attention_heads", "hidden_size"});
}

TEST_F(BadInput, KvHeadsNotDividingHeads) {
  auto j = config();
  j["num_key_value_heads"] = 3;
  write_config(j);
  expect_error({"config.json", "num_key_value_heads"});
}

TEST_F(BadInput, RankZero) {
  auto j = config();
  j["bottleneck"]["rank"] = 0;
  write_config(j);
  expect_error({"config.json", "bottleneck.rank"});
}

TEST_F(BadInput, RankLargerThanLayer) {
  auto j = config();
  j["bottleneck"]["ranks"] = {{"k", 1000}};
  write_config(j);
  expect_error({"config.json", "bottleneck.ranks.k", "1000"});
}

TEST_F(BadInput, NegativeRank) {
  auto j = config();
  j["bottleneck"]["rank"] = -4;
  write_config(j);
  expect_error({"config.json", "bottleneck.rank"});
}

TEST_F(BadInput, ConfigNotJson) {
  std::ofstream(dir / "ckpt/config.json") << "{\"hidden_size\": 32,";
  expect_error({"config.json", "not valid JSON"});
}

TEST_F(BadInput, ConfigKeyWrongType) {
  auto j = config();
  j["hidden_size"] = "thirty-two";
  write_config(j);
  expect_error({"config.json", "hidden_size"});
}

TEST_F(BadInput, ConfigMissingKey) {
  auto j = config();
  j.erase("intermediate_size");
  write_config(j);
  expect_error({"config.json", "intermediate_size"});
}

TEST_F(BadInput, UnknownBottleneckKind) {
  auto j = config();
  j["bottleneck"]["kind"] = "lora";
  write_config(j);
  expect_error({"config.json", "bottleneck.kind", "lora"});
}

TEST_F(BadInput, MissingTensor) {
  // The config of an untied model over weights of a tied one: lm_head.weight is missing.
  auto j = config();
  j["tie_word_embeddings"] = true;
  write_config(j);
  LlamaModel other(tiny_config(BottleneckKind::cola, 4, /*tied=*/true));
  save_model(other, dir / "tied");
  fs::copy_file(dir / "tied/model.safetensors", dir / "ckpt/model.safetensors",
                fs::copy_options::overwrite_existing);
  j["tie_word_embeddings"] = false;
  write_config(j);
  expect_error({"model.safetensors", "missing tensor 'lm_head.weight'"});
}

TEST_F(BadInput, MisShapedTensor) {
  auto j = config();
  j["intermediate_size"] = 40;  // every gate/up/down tensor now has the wrong shape
  write_config(j);
  expect_error(
      {"model.safetensors", "model.layers.0.mlp.gate_proj.B.weight", "[48, 8]", "[40, 8]"});
}

TEST_F(BadInput, UnexpectedTensor) {
  auto j = config();
  j["tie_word_embeddings"] = true;
  write_config(j);
  expect_error({"model.safetensors", "unexpected tensor 'lm_head.weight'"});
}

TEST_F(BadInput, TruncatedSafetensors) {
  const std::string path = dir / "ckpt/model.safetensors";
  fs::resize_file(path, fs::file_size(path) - 100);
  expect_error({"model.safetensors", "truncated"});
}

TEST_F(BadInput, TruncatedInsideHeader) {
  const std::string path = dir / "ckpt/model.safetensors";
  fs::resize_file(path, 20);
  expect_error({"model.safetensors", "not a safetensors file"});
}

TEST_F(BadInput, ForeignFileAsSafetensors) {
  std::ofstream(dir / "ckpt/model.safetensors", std::ios::binary)
      << "\x89PNG\r\n\x1a\n this is a picture, not weights";
  expect_error({"model.safetensors", "not a safetensors file"});
}

TEST_F(BadInput, EmptySafetensors) {
  std::ofstream(dir / "ckpt/model.safetensors", std::ios::binary | std::ios::trunc);
  expect_error({"model.safetensors", "not a safetensors file"});
}

TEST_F(BadInput, MissingCheckpointDirectory) {
  fs::remove_all(dir / "ckpt");
  expect_error({"ckpt", "does not exist"});
}

TEST_F(BadInput, TruncatedShard) {
  fs::resize_file(dir / "val.bin", fs::file_size(dir / "val.bin") - 3);
  expect_error({"val.bin", "truncated"});
}

TEST_F(BadInput, ForeignShard) {
  std::ofstream(dir / "val.bin", std::ios::binary | std::ios::trunc) << std::string(2000, 'x');
  expect_error({"val.bin", "not a token shard"});
}

TEST_F(BadInput, TokenOutsideVocabulary) {
  write_token_shard(dir / "val.bin", std::vector<int32_t>(33, 64));
  expect_error({"token id 64", "vocabulary"});
}

TEST_F(BadInput, TooFewTokens) {
  write_token_shard(dir / "val.bin", std::vector<int32_t>(10, 1));
  expect_error({"val.bin", "too few for one window"});
}

// What a bug report needs, without starting MPI: the version and commit, how it was built,
// the backends and communicators compiled in, and the CPU with what oneDNN dispatches to.
TEST(Version, NamesTheBuildTheBackendsAndTheCpu) {
  const CommandResult r = run(fmt::format("timeout 10 {} --version", bottle_binary()));
  ASSERT_EQ(r.status, 0) << r.output;
  for (const char* part : {"bottle ", "commit ", "compiled for: x86-64", "backend cpu: oneDNN",
                           "backend reference", "communicator mpi: ", "this CPU: ", "oneDNN "})
    EXPECT_NE(r.output.find(part), std::string::npos) << part << " missing in:\n" << r.output;
  // A build with the cuda backend says, without a GPU, which attention a bf16 GPU run would get:
  // cuDNN's with its version and library, or the own kernels and why; where its module cannot
  // be loaded (tests/cli/test_gpu_modules.cpp), that instead.
  const bool module_loads =
      r.output.find("backend cuda: this build's CUDA module could not be loaded") ==
      std::string::npos;
  if (r.output.find("backend cuda: ") != std::string::npos && module_loads) {
    const size_t at = r.output.find("backend cuda attention: ");
    ASSERT_NE(at, std::string::npos) << r.output;
    const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
    EXPECT_TRUE(line.find("cuDNN 9.") != std::string::npos ||
                line.find("cuDNN not loadable: ") != std::string::npos ||
                line.find("own kernels only (this build has no cuDNN") != std::string::npos)
        << line;
  }
}

// The first hour: every command's --help shows the default of every numeric option that has
// one (what is not REQUIRED has one), so that nothing is guessed.
TEST(Help, ShowsEveryNumericDefault) {
  int numeric = 0;
  for (const char* command : {"train", "eval", "prepare", "tokenize", "sample", "export", "lowrank",
                              "plan", "inspect", "plot", "bench step", "bench tp", "bench norm",
                              "bench paper", "bench pipeline", "bench tokenize"}) {
    SCOPED_TRACE(command);
    const CommandResult r = run(fmt::format("timeout 10 {} {} --help", bottle_binary(), command));
    ASSERT_EQ(r.status, 0) << r.output;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);) {
      const bool option = line.find_first_not_of(' ') != std::string::npos &&
                          line.substr(line.find_first_not_of(' ')).starts_with("--");
      const bool typed = line.find(" INT") != std::string::npos ||
                         line.find(" UINT") != std::string::npos ||
                         line.find(" FLOAT") != std::string::npos;
      if (!option || !typed || line.find("REQUIRED") != std::string::npos) continue;
      ++numeric;
      EXPECT_NE(line.find('='), std::string::npos) << "no default shown: " << line;
    }
  }
  // The lines were read: there are dozens of numeric options.
  EXPECT_GT(numeric, 30);
  // As CLI11 prints it: sample's --tokens is 200 unless told.
  const CommandResult sample = run(fmt::format("{} sample --help", bottle_binary()));
  EXPECT_NE(sample.output.find("--tokens INT:an integer >= 0=200"), std::string::npos)
      << sample.output;
}

// The first hour: `tokenize --text` encodes the text itself (byte-level without a tokenizer),
// where --input reads a file.
TEST(Tokenize, TextIsTheTextItself) {
  const CommandResult r = run(fmt::format("{} tokenize --text 'hi there'", bottle_binary()));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "[104,105,32,116,104,101,114,101]\n");
}

}  // namespace
}  // namespace bottle::testing
