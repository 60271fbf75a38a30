// One command-line grammar (issue 12 §2): every command reads --set through train's schema
// (quoted TOML and bare values alike, the same messages), refuses the keys it does not read
// with its reason, refuses nonsensical option values naming the option and its range, and
// eval runs under any tp x pp x dp layout with the loss of one process.
#include <fstream>
#include <nlohmann/json.hpp>

#include "backend/backend.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

// Every hostile command must end within this, never hang; commands that do work get longer.
constexpr int kTimeoutS = 10;
constexpr int kWorkTimeoutS = 120;

class CliGrammar : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    LlamaModel model(tiny_config(BottleneckKind::cola));
    init_for_test(model, 1);
    save_model(model, *dir_ / "ckpt");
    write_random_shard(*dir_ / "val.bin", 8 * 2 * 16 + 1, 64, 2);
    write_config("tiny.toml", "");
    write_config("tiny_block.toml", "recompute = \"block\"\n");
    write_config("tiny_accum.toml", "grad_accum_steps = 2\n");
  }
  static void TearDownTestSuite() { dir_.reset(); }

  // The tiny model of the checkpoint as a training configuration, with `training` lines.
  static void write_config(const std::string& name, const std::string& training) {
    std::ofstream(*dir_ / name) << kTinyColaModelToml
                                << fmt::format(R"([training]
steps = 2
micro_batch_size = 2
seq_len = 16
{}
[data]
train = "{}"

[checkpoint]
folder = "{}"
)",
                                               training, *dir_ / "val.bin", *dir_ / "run");
  }

  // `args` with {dir} standing for the scratch directory, run with a hard timeout.
  static CommandResult bottle(const std::string& args, const std::string& launcher = "",
                              int timeout_s = kTimeoutS) {
    std::string expanded = args;
    for (size_t at; (at = expanded.find("{dir}")) != std::string::npos;)
      expanded.replace(at, 5, dir_->str());
    return run(
        fmt::format("{} timeout -k 2 {} {} {}", launcher, timeout_s, bottle_binary(), expanded));
  }

  static std::unique_ptr<TempDir> dir_;
};

std::unique_ptr<TempDir> CliGrammar::dir_;

#define EVAL_NO_SEQ "eval --checkpoint {dir}/ckpt --data {dir}/val.bin --batch 2"
const char* const kEvalNoSeq = EVAL_NO_SEQ;
const char* const kEval = EVAL_NO_SEQ " --seq 16";
#undef EVAL_NO_SEQ
const char* const kSample = "sample --checkpoint {dir}/ckpt --prompt ab --tokens 2";

struct Hostile {
  const char* name;
  std::string args;
  const char* message;  // a part of the one error line
};

void PrintTo(const Hostile& h, std::ostream* os) { *os << h.args; }

class HostileArgs : public CliGrammar, public ::testing::WithParamInterface<Hostile> {};

TEST_P(HostileArgs, OneErrorNamingTheOptionOrKey) {
  const Hostile h = GetParam();
  const CommandResult r = bottle(h.args);
  EXPECT_NE(r.status, 124) << "hung: " << h.args;
  EXPECT_EQ(r.status, 1) << h.args << "\n" << r.output;
  EXPECT_NE(r.output.find("bottle: error: "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(h.message), std::string::npos)
      << h.args << "\nexpected: " << h.message << "\ngot: " << r.output;
  EXPECT_EQ(r.output.find("internal error"), std::string::npos) << r.output;
}

std::string with(const char* command, const char* extra) {
  return std::string(command) + " " + extra;
}

INSTANTIATE_TEST_SUITE_P(
    Options, HostileArgs,
    ::testing::Values(
        Hostile{"eval_seq_0", with(kEvalNoSeq, "--seq 0"),
                "--seq: must be an integer >= 1, got '0'"},
        Hostile{"eval_seq_long", with(kEvalNoSeq, "--seq 65"),
                "--seq: must be <= max_position_embeddings"},
        Hostile{"eval_threads_negative", with(kEval, "--threads -3"),
                "--threads: must be an integer in [1, 4096], got '-3'"},
        Hostile{"eval_batch_0", with(kEval, "--batch 0"),
                "--batch: must be an integer >= 1, got '0'"},
        Hostile{"eval_batches_0", with(kEval, "--batches 0"),
                "--batches: must be an integer >= 1, got '0'"},
        Hostile{"eval_batch_text", with(kEval, "--batch two"),
                "--batch: must be an integer >= 1, got 'two'"},
        Hostile{"sample_temperature_nan", with(kSample, "--temperature nan"),
                "--temperature: must be a finite number in [0, 1e+30], got 'nan'"},
        Hostile{"sample_temperature_inf", with(kSample, "--temperature inf"),
                "--temperature: must be a finite number"},
        Hostile{"sample_temperature_negative", with(kSample, "--temperature -1"),
                "--temperature: must be a finite number"},
        Hostile{"sample_tokens_negative", with(kSample, "--tokens -1"),
                "--tokens: must be an integer >= 0"},
        Hostile{"sample_top_k_negative", with(kSample, "--top-k -2"),
                "--top-k: must be an integer >= 0"},
        Hostile{"sample_seed_negative", with(kSample, "--seed -1"),
                "--seed: must be an integer >= 0"},
        Hostile{"bench_step_batch_0", "bench step --batch 0 --torch false",
                "--batch: must be an integer >= 1, got '0'"},
        Hostile{"bench_step_hidden_0", "bench step --hidden 0 --torch false",
                "--hidden: must be an integer >= 1"},
        Hostile{"bench_step_threads_0", "bench step --threads 0 --torch false",
                "--threads: must be an integer in [1, 4096]"},
        Hostile{"bench_step_steps_0", "bench step --steps 0 --torch false",
                "--steps: must be an integer in [1, "},
        Hostile{"bench_step_warmup_negative", "bench step --warmup -1 --torch false",
                "--warmup: must be an integer in [0, "},
        Hostile{"bench_step_backend_unknown", "bench step --backend tpu --torch false",
                "--backend: tpu not in {cpu,reference,cuda}"},
        Hostile{"bench_step_peak_tflops_0", "bench step --peak-tflops 0 --torch false",
                "--peak-tflops: must be a finite number in [1e-06, "},
        Hostile{"bench_step_peak_tflops_nan", "bench step --peak-tflops nan --torch false",
                "--peak-tflops: must be a finite number"},
        Hostile{"bench_tp_steps_0", "bench tp {dir}/tiny.toml --steps 0",
                "--steps: must be an integer in [1, "},
        Hostile{"bench_tp_threads_negative", "bench tp {dir}/tiny.toml --threads -1",
                "--threads: must be an integer in [1, 4096]"},
        Hostile{"bench_tp_fit_max_0", "bench tp {dir}/tiny.toml --fit 1GiB --fit-max 0",
                "--fit-max: must be an integer in [1, "},
        Hostile{"bench_pipeline_warmup_negative", "bench pipeline {dir}/tiny.toml --warmup -1",
                "--warmup: must be an integer in [0, "},
        Hostile{"bench_norm_rows_0", "bench norm --rows 0", "--rows: must be an integer >= 1"},
        Hostile{"bench_norm_threads_0", "bench norm --threads 0",
                "--threads: must be an integer in [1, 4096]"},
        Hostile{"prepare_val_fraction_nan",
                "prepare --input {dir}/none.txt --output {dir}/out --val-fraction nan",
                "--val-fraction: must be a finite number in [0, 1), got 'nan'"},
        Hostile{"prepare_shard_tokens_0",
                "prepare --input {dir}/none.txt --output {dir}/out --shard-tokens 0",
                "--shard-tokens: must be an integer in [1, 2147483647], got '0'"}),
    [](const auto& info) { return std::string(info.param.name); });

INSTANTIATE_TEST_SUITE_P(
    Keys, HostileArgs,
    ::testing::Values(
        Hostile{"eval_tp_text", with(kEval, "--set parallel.tp=abc"),
                "--set: key 'parallel.tp' must be an integer, got 'abc'"},
        Hostile{"eval_tp_mode_bad", with(kEval, "--set parallel.tp_mode=fast"),
                "--set: key 'parallel.tp_mode' must be one of \"full\", \"vanilla\", \"btp\"; "
                "got \"fast\""},
        Hostile{"eval_unknown_key", with(kEval, "--set parallel.tpp=2"),
                "--set: unknown key 'parallel.tpp' (did you mean 'parallel.tp'?)"},
        Hostile{"eval_model_key", with(kEval, "--set model.hidden_size=64"),
                "--set: eval does not read key 'model.hidden_size': it evaluates the "
                "checkpoint's model"},
        Hostile{"eval_recompute", with(kEval, "--set training.recompute=block"),
                "--set: eval does not read key 'training.recompute'"},
        Hostile{"eval_layout_mismatch", with(kEval, "--set parallel.dp=2"),
                "world size 1 does not equal parallel.tp × parallel.pp × parallel.dp"},
        Hostile{"sample_tp", with(kSample, "--set parallel.tp=2"),
                "--set: sample does not read key 'parallel.tp': it runs the checkpoint's model "
                "on one process"},
        Hostile{"sample_tp_text", with(kSample, "--set parallel.tp=abc"),
                "--set: key 'parallel.tp' must be an integer, got 'abc'"},
        Hostile{"bench_tp_data", "bench tp {dir}/tiny.toml --set data.train=x.bin",
                "--set: bench tp does not read key 'data.train': it times one training step"},
        Hostile{"bench_tp_tp_mode", "bench tp {dir}/tiny.toml --set parallel.tp_mode=vanilla",
                "--set: bench tp does not read key 'parallel.tp_mode'"},
        Hostile{
            "bench_tp_file_accum", "bench tp {dir}/tiny_accum.toml",
            "tiny_accum.toml: bench tp does not read key 'training.grad_accum_steps' (set to 2; "
            "its default is 1)"},
        Hostile{"bench_step_precision", "bench step --precision fp32,fp16 --torch false",
                "--precision: 'fp16' is not a precision (fp32 or bf16)"},
        Hostile{"bench_tp_lowrank", "bench tp {dir}/tiny.toml --set training.recompute=lowrank",
                "key 'training.recompute' = \"lowrank\" applies to btp only"},
        Hostile{"bench_pipeline_schedule",
                "bench pipeline {dir}/tiny.toml --set parallel.schedule=gpipe",
                "--set: bench pipeline does not read key 'parallel.schedule'"},
        Hostile{"bench_step_tp", "bench step {dir}/tiny.toml --set parallel.tp=2 --torch false",
                "--set: bench step does not read key 'parallel.tp'"},
        Hostile{"bench_step_save_to_a_file",
                "bench step {dir}/tiny.toml --torch false --steps 1 --warmup 0 --save "
                "{dir}/tiny.toml",
                "tiny.toml: the output directory must be a directory, and this is a regular "
                "file"},
        Hostile{"bench_step_file_recompute", "bench step {dir}/tiny_block.toml --torch false",
                "tiny_block.toml: bench step does not read key 'training.recompute'"}),
    [](const auto& info) { return std::string(info.param.name); });

// The same bad --set item reads the same in train as in eval: one parser.
TEST_F(CliGrammar, EvalAndTrainShareOneParser) {
  for (const char* item : {"parallel.tp=abc", "parallel.tp=0", "parallel.grouping=maybe",
                           "parallel.tp_mode=fast", "parallel.pp=-1"}) {
    const CommandResult t = bottle(fmt::format("train {{dir}}/tiny.toml --set {}", item));
    const CommandResult e = bottle(fmt::format("{} --set {}", kEval, item));
    EXPECT_EQ(t.status, 1) << t.output;
    EXPECT_EQ(e.status, 1) << e.output;
    EXPECT_EQ(t.output, e.output) << item;
  }
}

double json_loss(const CommandResult& r) {
  const size_t brace = r.output.rfind('{');
  EXPECT_NE(brace, std::string::npos) << r.output;
  if (brace == std::string::npos) return -1;
  return nlohmann::json::parse(r.output.substr(brace)).at("loss").get<double>();
}

// Quoted TOML and bare values, in every command that takes --set.
TEST_F(CliGrammar, QuotedAndBareValuesEverywhere) {
  const std::string quoted = "--set 'parallel.tp_mode=\"btp\"' --set 'parallel.grouping=false'";
  const std::string bare = "--set parallel.tp_mode=btp --set parallel.grouping=false";
  double losses[2];
  int i = 0;
  for (const std::string& sets : {quoted, bare}) {
    const CommandResult r =
        bottle(fmt::format("{} --batches 2 --json {}", kEval, sets), "", kWorkTimeoutS);
    ASSERT_EQ(r.status, 0) << sets << "\n" << r.output;
    losses[i++] = json_loss(r);
    // sample parses them, then says it reads none.
    const CommandResult s = bottle(fmt::format("{} {}", kSample, sets));
    EXPECT_EQ(s.status, 1) << s.output;
    EXPECT_NE(s.output.find("sample does not read key 'parallel.tp_mode'"), std::string::npos)
        << s.output;
  }
  EXPECT_EQ(losses[0], losses[1]);
  for (const std::string& sets : {std::string("--set 'training.recompute=\"block\"'"),
                                  std::string("--set training.recompute=block")}) {
    const CommandResult tp =
        bottle("bench tp {dir}/tiny.toml --steps 1 --warmup 0 --json " + sets, "", kWorkTimeoutS);
    EXPECT_EQ(tp.status, 0) << sets << "\n" << tp.output;
    const CommandResult pipe =
        bottle("bench pipeline {dir}/tiny.toml --steps 1 --warmup 0 " + sets, "", kWorkTimeoutS);
    EXPECT_EQ(pipe.status, 0) << sets << "\n" << pipe.output;
  }
  for (const std::string& sets : {std::string("--set 'model.bottleneck=\"svd\"'"),
                                  std::string("--set model.bottleneck=svd")}) {
    const CommandResult step =
        bottle("bench step {dir}/tiny.toml --steps 1 --warmup 0 --torch false --json " + sets, "",
               kWorkTimeoutS);
    EXPECT_EQ(step.status, 0) << sets << "\n" << step.output;
    EXPECT_NE(step.output.find("\"kind\":\"svd\""), std::string::npos) << step.output;
  }
}

// bench tp's rows run under training.recompute, from the file and from --set alike.
TEST_F(CliGrammar, BenchTpHonoursRecompute) {
  auto rows = [&](const std::string& args) {
    const CommandResult r =
        bottle("bench tp " + args + " --steps 1 --warmup 0 --json", "", kWorkTimeoutS);
    EXPECT_EQ(r.status, 0) << r.output;
    std::map<std::string, nlohmann::json> by_mode;
    std::istringstream lines(r.output);
    for (std::string line; std::getline(lines, line);)
      if (line.starts_with("{")) {
        const auto j = nlohmann::json::parse(line);
        by_mode[j.at("mode").get<std::string>()] = j;
      }
    return by_mode;
  };
  const auto none = rows("{dir}/tiny.toml");
  const auto from_set = rows("{dir}/tiny.toml --set training.recompute=block");
  const auto from_file = rows("{dir}/tiny_block.toml");
  ASSERT_EQ(none.size(), 3u);
  for (const auto* block : {&from_set, &from_file}) {
    ASSERT_EQ(block->size(), 3u);
    for (const auto& [mode, row] : *block) {
      EXPECT_EQ(row.at("recompute"), "block") << mode;
      EXPECT_LT(row.at("activation_bytes").get<double>(),
                none.at(mode).at("activation_bytes").get<double>())
          << mode;
    }
  }
  for (const auto& [mode, row] : none) EXPECT_EQ(row.at("recompute"), "none") << mode;
}

nlohmann::json last_json(const CommandResult& r) {
  const size_t brace = r.output.rfind('{');
  if (brace == std::string::npos) return nlohmann::json::object();
  return nlohmann::json::parse(r.output.substr(brace), nullptr, false);
}

// bench step runs on --backend, else on the file's training.backend; MFU against a nominal
// peak comes with --peak-tflops; a backend that cannot run here is refused naming where the
// choice came from and why (backend_unavailable).
TEST_F(CliGrammar, BenchStepBackendAndNominalPeak) {
  const std::string step = "bench step {dir}/tiny.toml --steps 1 --warmup 0 --torch false --json";
  const CommandResult cpu = bottle(
      step + " --set training.backend=reference --backend cpu --peak-tflops 2", "", kWorkTimeoutS);
  ASSERT_EQ(cpu.status, 0) << cpu.output;
  const nlohmann::json row = last_json(cpu);
  EXPECT_EQ(row.value("backend", ""), "cpu") << cpu.output;
  EXPECT_EQ(row.value("nominal_peak_tflops", 0.0), 2.0) << cpu.output;
  EXPECT_DOUBLE_EQ(row.value("mfu_nominal", 0.0), row.value("gflops", -1.0) / 2000.0) << cpu.output;
  // The same run on cuda, chosen by the flag and by the file alike: it runs where a GPU is
  // visible, and elsewhere is refused with the reason.
  const std::string why = backend_unavailable("cuda");
  for (const char* choice : {"--backend cuda", "--set training.backend=cuda"}) {
    const CommandResult r = bottle(step + " " + choice, "", kWorkTimeoutS);
    if (why.empty()) {
      ASSERT_EQ(r.status, 0) << choice << "\n" << r.output;
      EXPECT_EQ(last_json(r).value("backend", ""), "cuda") << r.output;
      EXPECT_FALSE(last_json(r).contains("mfu_nominal")) << r.output;
      continue;
    }
    EXPECT_EQ(r.status, 1) << choice << "\n" << r.output;
    const std::string expected = choice[2] == 'b'
                                     ? "bottle: error: bench step: --backend cuda: " + why
                                     : "tiny.toml: training.backend = \"cuda\": " + why;
    EXPECT_NE(r.output.find(expected), std::string::npos) << expected << "\n" << r.output;
  }
}

// eval on the layouts a run trains on gives one process's loss (up to rounding).
TEST_F(CliGrammar, EvalUnderAnyLayout) {
  const std::string eval = std::string(kEval) + " --batches 3 --json";
  const CommandResult one = bottle(eval, "", kWorkTimeoutS);
  ASSERT_EQ(one.status, 0) << one.output;
  const double reference = json_loss(one);
  for (const char* sets : {"--set parallel.dp=2", "--set parallel.pp=2", "--set parallel.tp=2"}) {
    const CommandResult r = bottle(eval + " " + sets, mpirun(2, kWorkTimeoutS), kWorkTimeoutS);
    ASSERT_EQ(r.status, 0) << sets << "\n" << r.output;
    EXPECT_EQ(count_occurrences(r.output, "\"loss\""), 1) << r.output;
    EXPECT_NEAR(json_loss(r), reference, 1e-5 * reference) << sets;
  }
}

}  // namespace
}  // namespace bottle::testing
