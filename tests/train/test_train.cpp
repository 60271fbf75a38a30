// `bottle train` end to end on a tiny CoLA model: bit-exact resume (also with gradient
// accumulation, across a data epoch and after SIGINT/SIGTERM), atomic checkpoints under a
// SIGKILL in the middle of a save, keep-last-K, bad input (exit status 1, one error line
// naming the file or key, never a half-written checkpoint), NaN handling and the loss plot.
#include <omp.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include "backend/reference_backend.h"
#include "core/bf16.h"
#include "io/safetensors.h"
#include "test_util.h"
#include "train/train_step.h"

namespace bottle::testing {
namespace {

// Tiny GEMMs on a busy machine: spinning OpenMP workers make every run ~10x slower. The
// bottle processes inherit this.
const bool passive_omp = [] { return ::setenv("OMP_WAIT_POLICY", "passive", 0) == 0; }();

// A first-order Markov chain over the first 16 of the 64 tokens (next = 5·prev + 3 mod 16 with
// probability 0.85), so that the loss visibly falls within a few steps.
void write_learnable_shard(const std::string& path, int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  int32_t t = 0;
  for (auto& x : tokens) {
    x = t;
    t = rng() % 100 < 85 ? (5 * t + 3) % 16 : int32_t(rng() % 16);
  }
  write_token_shard(path, tokens);
}

// One training run's view of metrics.jsonl.
struct StepRow {
  int64_t step;
  double loss, lr, grad_norm;
  bool skipped;
};
struct Metrics {
  std::vector<StepRow> steps;
  std::map<int64_t, double> val_loss;
};

Metrics read_metrics(const std::string& path) {
  Metrics m;
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    // nlohmann::json writes NaN and infinities as null.
    auto number = [&](const char* key) {
      return j.at(key).is_null() ? NAN : j.at(key).get<double>();
    };
    if (j.contains("loss")) {
      m.steps.push_back({j.at("step").get<int64_t>(), number("loss"), number("lr"),
                         number("grad_norm"), j.at("skipped").get<bool>()});
    }
    if (j.contains("val_loss")) m.val_loss[j.at("step").get<int64_t>()] = number("val_loss");
  }
  return m;
}

int64_t count_step_lines(const std::string& path) {
  std::ifstream in(path);
  int64_t n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"loss\"") != std::string::npos;
  return n;
}

// Each step once, in order, 1..steps.
void expect_steps_once(const Metrics& m, int64_t steps) {
  ASSERT_EQ(int64_t(m.steps.size()), steps);
  for (int64_t i = 0; i < steps; ++i) EXPECT_EQ(m.steps[size_t(i)].step, i + 1);
}

// Identical to the last bit: the same doubles that nlohmann::json printed in full precision.
void expect_bit_identical(const Metrics& a, const Metrics& b) {
  ASSERT_EQ(a.steps.size(), b.steps.size());
  for (size_t i = 0; i < a.steps.size(); ++i) {
    SCOPED_TRACE(fmt::format("step {}", a.steps[i].step));
    EXPECT_EQ(a.steps[i].step, b.steps[i].step);
    EXPECT_EQ(a.steps[i].loss, b.steps[i].loss);
    EXPECT_EQ(a.steps[i].lr, b.steps[i].lr);
    EXPECT_EQ(a.steps[i].grad_norm, b.steps[i].grad_norm);
  }
  for (const auto& [step, v] : a.val_loss) {
    if (b.val_loss.count(step)) {
      EXPECT_EQ(v, b.val_loss.at(step)) << "val loss at step " << step;
    }
  }
}

std::vector<std::string> entries_with_prefix(const std::string& folder, const std::string& prefix) {
  std::vector<std::string> names;
  if (!fs::is_directory(folder)) return names;
  for (const auto& e : fs::directory_iterator(folder)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(prefix, 0) == 0) names.push_back(name);
  }
  std::sort(names.begin(), names.end());
  return names;
}

bool is_png(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string magic(8, '\0');
  in.read(magic.data(), 8);
  return in && magic == "\x89PNG\r\n\x1a\n";
}

// A complete checkpoint: the model's description, the one rank's weights and moments with the
// index that lists them, and the trainer state.
void expect_complete_checkpoint(const std::string& dir) {
  for (const char* f :
       {"config.json", "rank-00000.safetensors", "checkpoint_index.json", "trainer_state.json"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / f)) << dir << " lacks " << f;
}

// `bottle train` started in the background, its output in a file; killed if still running
// when the object dies.
class Background {
 public:
  Background(const std::string& command, const std::string& log) : log_(log) {
    const std::string shell = fmt::format("exec {} >'{}' 2>&1", command, log);
    pid_ = ::fork();
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", shell.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Background() {
    if (pid_ > 0 && status_ < 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  bool started() const { return pid_ > 0; }
  void signal(int sig) const { ::kill(pid_, sig); }
  // The exit status (128 + signal when killed), or -1 when still running after `seconds`.
  int wait(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (status_ < 0) {
      int s = 0;
      if (::waitpid(pid_, &s, WNOHANG) == pid_) {
        status_ = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
        break;
      }
      if (std::chrono::steady_clock::now() > deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return status_;
  }
  std::string output() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
  int status_ = -1;
};

// A scratch directory with data shards and a TOML configuration for the tiny model.
class Train : public ::testing::Test {
 public:
  void SetUp() override {
    write_learnable_shard(dir / "train.bin", 4000, 1);
    write_learnable_shard(dir / "val.bin", 1000, 2);
    write_config(dir / "tiny.toml", dir / "train.bin", dir / "val.bin", dir / "run");
  }

  static void write_config(const std::string& path, const std::string& train,
                           const std::string& val, const std::string& folder) {
    std::ofstream(path) << kTinyColaModelToml
                        << fmt::format(R"([training]
steps = 20
micro_batch_size = 2
seq_len = 16
seed = 7
max_norm = 1.0
eval_interval = 7
eval_batches = 2

[optimizer]
lr = 2e-2

[lr_scheduler]
warmup_steps = 3
decay = "cosine"

[data]
train = "{}"
val = "{}"

[checkpoint]
folder = "{}"
interval = 5
keep = 3
)",
                                       train, val, folder);
  }

  // `bottle train` on the configuration with `args` (--set ..., --resume) appended.
  CommandResult train(const std::string& args, const std::string& env = "") const {
    return run(fmt::format("{} {} train {} {}", env, bottle_binary(), dir / "tiny.toml", args));
  }
  std::string train_command(const std::string& args) const {
    return fmt::format("{} train {} {}", bottle_binary(), dir / "tiny.toml", args);
  }
  static std::string folder_arg(const std::string& folder) {
    return fmt::format("--set checkpoint.folder={}", folder);
  }

  TempDir dir;
};

// ---------------------------------------------------------------------------------------
// --init-from starts from a model directory's weights (fresh optimizer, step 0).

TEST_F(Train, InitFromStartsFromTheCheckpointsWeights) {
  const std::string a = dir / "a", b = dir / "b", fresh = dir / "fresh";
  ASSERT_EQ(train(folder_arg(a)).status, 0);
  const CommandResult from =
      train(fmt::format("{} --init-from {}/step_00000020", folder_arg(b), a));
  ASSERT_EQ(from.status, 0) << from.output;
  ASSERT_EQ(train(folder_arg(fresh)).status, 0);
  const Metrics ma = read_metrics(a + "/metrics.jsonl"), mb = read_metrics(b + "/metrics.jsonl"),
                mf = read_metrics(fresh + "/metrics.jsonl");
  // The first step of the run started from A's weights begins where A ended, far below a
  // fresh start's first loss.
  EXPECT_LT(mb.steps.front().loss, mf.steps.front().loss - 0.5);
  EXPECT_LT(std::fabs(mb.steps.front().loss - ma.steps.back().loss), 0.5);
  EXPECT_EQ(mb.steps.front().step, 1);
}

TEST_F(Train, InitFromAnotherShapeNamesTheKey) {
  ASSERT_EQ(train(folder_arg(dir / "a")).status, 0);
  const CommandResult r =
      train(fmt::format("{} --init-from {}/step_00000020 --set model.num_layers=3",
                        folder_arg(dir / "b"), dir / "a"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_NE(r.output.find("num_hidden_layers"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "b/step_00000001"));
}

// ---------------------------------------------------------------------------------------
// 1. Resume is bit-exact.

// Run A trains `steps` steps at once; run B stops at `stop` and resumes. The schedule must not
// depend on training.steps (decay "constant" with warmup), so B may stop by a shorter run.
void resume_matches(const Train& t, const std::string& folder_a, const std::string& folder_b,
                    const std::string& common, int64_t stop, int64_t steps) {
  const CommandResult a = t.train(
      fmt::format("{} {} --set training.steps={}", Train::folder_arg(folder_a), common, steps));
  ASSERT_EQ(a.status, 0) << a.output;
  const CommandResult b1 = t.train(
      fmt::format("{} {} --set training.steps={}", Train::folder_arg(folder_b), common, stop));
  ASSERT_EQ(b1.status, 0) << b1.output;
  EXPECT_TRUE(fs::exists(fmt::format("{}/step_{:08d}", folder_b, stop))) << b1.output;
  const CommandResult b2 = t.train(fmt::format("{} {} --set training.steps={} --resume",
                                               Train::folder_arg(folder_b), common, steps));
  ASSERT_EQ(b2.status, 0) << b2.output;
  EXPECT_NE(b2.output.find(fmt::format("step_{:08d} at step {}", stop, stop)), std::string::npos)
      << b2.output;
  const Metrics ma = read_metrics(folder_a + "/metrics.jsonl"),
                mb = read_metrics(folder_b + "/metrics.jsonl");
  expect_steps_once(ma, steps);
  expect_steps_once(mb, steps);
  expect_bit_identical(ma, mb);
  // B evaluated at its end (step `stop`) as well, which A did not: evaluation must not
  // disturb training. Both share the evals at multiples of eval_interval.
  EXPECT_FALSE(ma.val_loss.empty());
  EXPECT_TRUE(mb.val_loss.count(stop));
}

TEST_F(Train, LossFallsAndResumeIsBitExact) {
  ASSERT_NO_FATAL_FAILURE(
      resume_matches(*this, dir / "a", dir / "b", "--set lr_scheduler.decay=constant", 10, 20));
  const Metrics m = read_metrics(dir / "a/metrics.jsonl");
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i)
    first += m.steps[size_t(i)].loss / 5, last += m.steps[m.steps.size() - 1 - size_t(i)].loss / 5;
  EXPECT_LT(last, first - 0.5) << "the loss did not fall: " << first << " -> " << last;
}

// bf16: the checkpoint holds the fp32 masters (F32 in the file, torch_dtype float32), and the
// bf16 compute weights rebuilt from them on resume give the uninterrupted run's bits.
TEST_F(Train, ResumeIsBitExactInBf16) {
  ASSERT_NO_FATAL_FAILURE(
      resume_matches(*this, dir / "a", dir / "b",
                     "--set lr_scheduler.decay=constant --set training.precision=bf16", 6, 12));
  const SafeTensorsReader weights(dir / "b/step_00000006/rank-00000.safetensors");
  for (const auto& [name, entry] : weights.entries()) EXPECT_EQ(entry.dtype, "F32") << name;
  std::ifstream config(dir / "b/step_00000006/config.json");
  const std::string text((std::istreambuf_iterator<char>(config)), {});
  EXPECT_NE(text.find("\"torch_dtype\": \"float32\""), std::string::npos) << text;
  // bf16 for inference: half the bytes, torch_dtype bfloat16, each value the master rounded.
  const CommandResult exported =
      run(fmt::format("{} export --checkpoint {} --out {} --dtype bf16", bottle_binary(),
                      dir / "b/step_00000006", dir / "bf16"));
  ASSERT_EQ(exported.status, 0) << exported.output;
  const SafeTensorsReader half(dir / "bf16/model.safetensors");
  // The rank's pieces of the weights are whole tensors on one rank ("NAME@0"); the moments'
  // ("exp_avg/NAME@0") are not exported.
  for (const auto& [key, entry] : weights.entries()) {
    if (key.find('/') != std::string::npos) continue;
    const std::string name = key.substr(0, key.rfind('@'));
    const SafeTensorEntry& h = half.entry(name);
    EXPECT_EQ(h.dtype, "BF16") << name;
    EXPECT_EQ(2 * (h.end - h.begin), entry.end - entry.begin) << name;
    std::vector<float> master(size_t(entry.numel())), rounded(size_t(entry.numel()));
    weights.read_f32(key, master);
    half.read_f32(name, rounded);
    for (size_t i = 0; i < master.size(); ++i)
      ASSERT_EQ(rounded[i], round_to_bf16(master[i])) << name << "[" << i << "]";
  }
  std::ifstream half_config(dir / "bf16/config.json");
  const std::string half_text((std::istreambuf_iterator<char>(half_config)), {});
  EXPECT_NE(half_text.find("\"torch_dtype\": \"bfloat16\""), std::string::npos) << half_text;
}

// Issue 57: in bf16 too every tag's measured peak stays within its plan, through evaluations
// and saves: the cpu backend's per-thread slabs (two threads, so that they count twice) and,
// with oneDNN held to AVX2 where it has no bf16 matmul, its widened GEMM operands.
class Bf16MemoryPlan : public Train, public ::testing::WithParamInterface<const char*> {};

TEST_P(Bf16MemoryPlan, HoldsEveryPeak) {
  const CommandResult r = train(
      folder_arg(dir / "a") + " --set training.precision=bf16 --set training.steps=8", GetParam());
  ASSERT_EQ(r.status, 0) << r.output;
  if (std::string(GetParam()).find("AVX2") != std::string::npos) {
    EXPECT_NE(r.output.find("widened to fp32"), std::string::npos) << r.output;
  }
  std::ifstream in(dir / "a/metrics.jsonl");
  int rows = 0;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("memory_plan")) continue;
    ++rows;
    for (const auto& [tag, plan] : j.at("memory_plan").items())
      EXPECT_LE(j.at("memory").at(tag)[0].get<size_t>(), plan[0].get<size_t>())
          << "step " << j.at("step") << ", tag " << tag << " measured above its plan";
  }
  EXPECT_EQ(rows, 8);
}

INSTANTIATE_TEST_SUITE_P(Gemms, Bf16MemoryPlan,
                         ::testing::Values("OMP_NUM_THREADS=2",
                                           "OMP_NUM_THREADS=2 DNNL_MAX_CPU_ISA=AVX2 "
                                           "ONEDNN_MAX_CPU_ISA=AVX2"),
                         [](const auto& info) {
                           return std::string(info.index == 0 ? "AsTheyRun" : "Widened");
                         });

// A backend without bf16 kernels (the reference's own, unwrapped) is refused with its
// reason, never run in fp32.
TEST_F(Train, Bf16OnABackendWithoutItIsRefused) {
  TrainConfig config;
  config.model = tiny_config(BottleneckKind::cola);
  config.training.micro_batch_size = 2;
  config.training.seq_len = 16;
  config.training.precision = Precision::bf16;
  const std::unique_ptr<Backend> raw = make_reference_backend();
  try {
    TrainStep step(config, *raw, tensor_parallel_of(config, nullptr), nullptr, nullptr);
    FAIL() << "bf16 ran on a backend without bf16 kernels";
  } catch (const Error& e) {
    EXPECT_NE(
        std::string(e.what()).find("training.precision = \"bf16\" on the reference backend: it "
                                   "has no bf16 kernels"),
        std::string::npos)
        << e.what();
  }
}

TEST_F(Train, ResumeIsBitExactWithGradientAccumulation) {
  resume_matches(*this, dir / "a", dir / "b",
                 "--set lr_scheduler.decay=constant --set training.grad_accum_steps=2", 10, 20);
}

TEST_F(Train, ResumeIsBitExactAcrossAnEpoch) {
  // 8 windows of 2·16 tokens: step 10 stops in the second epoch, step 17 starts the third.
  write_learnable_shard(dir / "small.bin", 8 * 32 + 1, 3);
  resume_matches(
      *this, dir / "a", dir / "b",
      fmt::format("--set lr_scheduler.decay=constant --set data.train={}", dir / "small.bin"), 10,
      20);
  std::ifstream in(dir / "b/step_00000010/trainer_state.json");
  const auto state = nlohmann::json::parse(in);
  EXPECT_EQ(state.at("train_position").dump(), R"({"epoch":1,"shard_index":0,"window_index":2})");
}

// ---------------------------------------------------------------------------------------
// 4. SIGINT/SIGTERM finish the step, checkpoint and exit 0; --resume then gives the same
// losses as an uninterrupted run, under the cosine schedule that depends on training.steps.

TEST_F(Train, SignalsStopCleanlyAndResumeIsBitExact) {
  const int64_t steps = 60;
  const std::string common = fmt::format(
      "--set training.steps={} --set checkpoint.interval=0 --set training.eval_interval=25", steps);
  const CommandResult a = train(folder_arg(dir / "a") + " " + common);
  ASSERT_EQ(a.status, 0) << a.output;
  const Metrics ma = read_metrics(dir / "a/metrics.jsonl");
  ASSERT_EQ(int64_t(ma.steps.size()), steps);

  for (const int sig : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(sig == SIGINT ? "SIGINT" : "SIGTERM");
    const std::string folder = dir / fmt::format("sig{}", sig);
    Background b(train_command(folder_arg(folder) + " " + common), folder + ".log");
    ASSERT_TRUE(b.started());
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (count_step_lines(folder + "/metrics.jsonl") < 3 && b.wait(0) < 0 &&
           std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    b.signal(sig);
    const auto t0 = std::chrono::steady_clock::now();
    const int status = b.wait(10);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_EQ(status, 0) << b.output();
    EXPECT_LT(seconds, 5.0);
    const Metrics m = read_metrics(folder + "/metrics.jsonl");
    ASSERT_FALSE(m.steps.empty());
    const int64_t stopped = m.steps.back().step;
    ASSERT_LT(stopped, steps) << "the run finished before the signal";
    EXPECT_NE(b.output().find(fmt::format("stopped by signal {} after step {}", sig, stopped)),
              std::string::npos)
        << b.output();
    EXPECT_EQ(entries_with_prefix(folder, "step_"),
              std::vector<std::string>{fmt::format("step_{:08d}", stopped)});
    expect_complete_checkpoint(fmt::format("{}/step_{:08d}", folder, stopped));
    EXPECT_TRUE(entries_with_prefix(folder, ".tmp-").empty());

    const CommandResult resumed = train(folder_arg(folder) + " " + common + " --resume");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    EXPECT_NE(resumed.output.find(fmt::format("step_{:08d} at step {}", stopped, stopped)),
              std::string::npos)
        << resumed.output;
    const Metrics mb = read_metrics(folder + "/metrics.jsonl");
    expect_steps_once(mb, steps);
    expect_bit_identical(ma, mb);
  }
}

// ---------------------------------------------------------------------------------------
// 2. A checkpoint killed half-way leaves the previous one intact.

class KilledCheckpoint : public Train, public ::testing::WithParamInterface<int> {};

TEST_P(KilledCheckpoint, PreviousCheckpointSurvives) {
  const int n = GetParam();
  const std::string folder = dir / "run";
  // The first checkpoint, at step 5.
  const CommandResult first = train("--set training.steps=5");
  ASSERT_EQ(first.status, 0) << first.output;
  // The second, at step 10, dies after its n-th file.
  const CommandResult killed = train("--resume --set training.steps=20",
                                     fmt::format("BOTTLE_FAILPOINT=checkpoint_write:{}", n));
  EXPECT_EQ(killed.status, 128 + SIGKILL) << killed.output;
  EXPECT_EQ(entries_with_prefix(folder, "step_"), std::vector<std::string>{"step_00000005"});
  expect_complete_checkpoint(folder + "/step_00000005");
  const std::vector<std::string> temps = entries_with_prefix(folder, ".tmp-");
  ASSERT_EQ(temps.size(), 1u);
  EXPECT_EQ(temps[0], ".tmp-step_00000010");  // one name every rank of a job knows
  // What the killed save had written: the model's description and the rank's weights and
  // moments (n >= 2, synced from n = 3), + the index and the state (n = 4).
  EXPECT_TRUE(fs::exists(fs::path(folder) / temps[0] / "config.json"));
  EXPECT_TRUE(fs::exists(fs::path(folder) / temps[0] / "rank-00000.safetensors"));
  EXPECT_EQ(fs::exists(fs::path(folder) / temps[0] / "checkpoint_index.json"), n >= 4);
  EXPECT_EQ(fs::exists(fs::path(folder) / temps[0] / "trainer_state.json"), n >= 4);

  const CommandResult eval =
      run(fmt::format("{} eval --checkpoint {} --data {} --batch 2 --seq 16 --batches 2",
                      bottle_binary(), folder + "/step_00000005", dir / "val.bin"));
  EXPECT_EQ(eval.status, 0) << eval.output;

  const CommandResult resumed = train("--resume --set training.steps=10");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("step_00000005 at step 5"), std::string::npos) << resumed.output;
  EXPECT_TRUE(entries_with_prefix(folder, ".tmp-").empty())
      << "the save at step 10 did not clear " << temps[0];
  EXPECT_EQ(entries_with_prefix(folder, "step_"),
            (std::vector<std::string>{"step_00000005", "step_00000010"}));
  expect_complete_checkpoint(folder + "/step_00000010");
  // The killed run's metrics of steps 6..10 are replaced, not repeated.
  expect_steps_once(read_metrics(folder + "/metrics.jsonl"), 10);
}

INSTANTIATE_TEST_SUITE_P(AfterFile, KilledCheckpoint, ::testing::Values(2, 3, 4));

// ---------------------------------------------------------------------------------------
// 3. keep-last-K, 6. the trainer's loss plot.

TEST_F(Train, KeepsTheLastCheckpointsAndPlots) {
  const CommandResult r =
      train("--set training.steps=10 --set checkpoint.interval=2 --set checkpoint.keep=2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(entries_with_prefix(dir / "run", "step_"),
            (std::vector<std::string>{"step_00000008", "step_00000010"}));
  EXPECT_TRUE(entries_with_prefix(dir / "run", ".tmp-").empty());
  expect_complete_checkpoint(dir / "run/step_00000010");
  expect_steps_once(read_metrics(dir / "run/metrics.jsonl"), 10);
  EXPECT_TRUE(is_png(dir / "run/loss.png"));
}

// ---------------------------------------------------------------------------------------
// 5. Bad input: exit status 1, one error line naming the file or key, no checkpoint.

void expect_error(const CommandResult& r, const std::vector<std::string>& needles) {
  EXPECT_EQ(r.status, 1) << r.output;
  const size_t at = r.output.find("bottle: error:");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("bottle: error:", at + 1), std::string::npos)
      << "more than one error line: " << r.output;
  const std::string line = r.output.substr(at, r.output.find('\n', at) - at);
  for (const std::string& n : needles)
    EXPECT_NE(line.find(n), std::string::npos) << "missing '" << n << "' in: " << line;
}

void expect_no_checkpoint(const std::string& folder) {
  EXPECT_TRUE(entries_with_prefix(folder, "step_").empty());
  EXPECT_TRUE(entries_with_prefix(folder, ".tmp-").empty());
}

struct BadShard {
  std::string split, kind, message;
};

class BadShardInput : public Train, public ::testing::WithParamInterface<BadShard> {};

TEST_P(BadShardInput, NamesTheFile) {
  const BadShard p = GetParam();
  const std::string shard = dir / "bad.bin";
  if (p.kind == "empty") {
    write_token_shard(shard, {});
  } else if (p.kind == "truncated") {
    fs::copy_file(dir / "train.bin", shard);
    fs::resize_file(shard, fs::file_size(shard) - 101);
  } else if (p.kind == "foreign") {
    std::ofstream(shard, std::ios::binary) << std::string(3000, 'x');
  }
  const CommandResult r = train(fmt::format("--set data.{}={}", p.split, shard));
  expect_error(r, {"bad.bin", p.message});
  expect_no_checkpoint(dir / "run");
}

INSTANTIATE_TEST_SUITE_P(Shards, BadShardInput,
                         ::testing::Values(BadShard{"train", "missing", "no token shard"},
                                           BadShard{"train", "empty", "empty"},
                                           BadShard{"train", "truncated", "truncated"},
                                           BadShard{"train", "foreign", "not a token shard"},
                                           BadShard{"val", "missing", "no token shard"},
                                           BadShard{"val", "empty", "empty"},
                                           BadShard{"val", "truncated", "truncated"},
                                           BadShard{"val", "foreign", "not a token shard"}),
                         [](const auto& info) { return info.param.split + "_" + info.param.kind; });

struct BadConfig {
  std::string name, from, to;  // replace `from` in the TOML by `to`
  std::vector<std::string> needles;
};

class BadConfigInput : public Train, public ::testing::WithParamInterface<BadConfig> {};

TEST_P(BadConfigInput, NamesTheKey) {
  const BadConfig p = GetParam();
  std::ifstream in(dir / "tiny.toml");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t at = text.find(p.from);
  ASSERT_NE(at, std::string::npos);
  text.replace(at, p.from.size(), p.to);
  std::ofstream(dir / "tiny.toml") << text;
  std::vector<std::string> needles = p.needles;
  needles.push_back("tiny.toml");
  expect_error(train(""), needles);
  expect_no_checkpoint(dir / "run");
}

INSTANTIATE_TEST_SUITE_P(
    Keys, BadConfigInput,
    ::testing::Values(
        BadConfig{"unknown_key", "seed = 7", "seed = 7\nsede = 8", {"training.sede"}},
        BadConfig{"wrong_type", "steps = 20", "steps = \"twenty\"", {"training.steps", "integer"}},
        BadConfig{"out_of_range", "lr = 2e-2", "lr = -0.5", {"optimizer.lr", "> 0"}},
        BadConfig{
            "bad_choice", "decay = \"cosine\"", "decay = \"exponential\"", {"lr_scheduler.decay"}}),
    [](const auto& info) { return info.param.name; });

TEST_F(Train, SetUnknownKey) {
  expect_error(train("--set training.stepz=3"), {"--set", "training.stepz"});
  expect_no_checkpoint(dir / "run");
}

TEST_F(Train, SetWrongType) {
  expect_error(train("--set training.steps=abc"), {"--set", "training.steps", "abc"});
  expect_no_checkpoint(dir / "run");
}

TEST_F(Train, SetOutOfRange) {
  expect_error(train("--set checkpoint.keep=0"), {"--set", "checkpoint.keep"});
  expect_no_checkpoint(dir / "run");
}

TEST_F(Train, ResumeWithoutCheckpoint) {
  expect_error(train("--resume"), {"--resume", "no checkpoint", dir / "run"});
}

TEST_F(Train, ResumeIntoAnotherModelShape) {
  const CommandResult first = train("--set training.steps=2");
  ASSERT_EQ(first.status, 0) << first.output;
  const CommandResult r = train("--resume --set model.hidden_size=64");
  expect_error(r, {"--resume", "hidden_size", "32", "64"});
  EXPECT_EQ(entries_with_prefix(dir / "run", "step_"), std::vector<std::string>{"step_00000002"});
  EXPECT_TRUE(entries_with_prefix(dir / "run", ".tmp-").empty());
}

// Issue 58: Muon (optimizer.name = "muon") resumes bit for bit, its checkpoint names its state
// (each matrix's momentum_buffer, AdamW's moments for the embedding and the 1-D parameters
// alone), and a run resumed under the other optimizer is refused naming both, while
// --init-from takes the weights alone.
TEST_F(Train, MuonResumeIsBitExactAndNamesItsState) {
  ASSERT_NO_FATAL_FAILURE(
      resume_matches(*this, dir / "a", dir / "b",
                     "--set lr_scheduler.decay=constant --set optimizer.name=\"muon\"", 10, 20));
  const Metrics m = read_metrics(dir / "a/metrics.jsonl");
  EXPECT_LT(m.steps.back().loss, m.steps.front().loss - 0.5);
  std::ifstream in(dir / "a/step_00000020/checkpoint_index.json");
  const std::string index((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto j = nlohmann::json::parse(index);
  EXPECT_EQ(j.at("metadata").at("optimizer"), "muon") << index;
  std::set<std::string> tensors;
  for (const auto& t : j.at("tensors")) tensors.insert(t.at("name").get<std::string>());
  for (const char* name : {"momentum_buffer/model.layers.0.self_attn.q_proj.A.weight",
                           "momentum_buffer/model.layers.1.mlp.down_proj.B.weight",
                           "exp_avg/model.embed_tokens.weight", "exp_avg_sq/model.norm.weight",
                           "exp_avg/model.layers.0.input_layernorm.weight"})
    EXPECT_TRUE(tensors.count(name)) << name << " missing from " << index;
  for (const char* name :
       {"exp_avg/model.layers.0.self_attn.q_proj.A.weight",
        "momentum_buffer/model.embed_tokens.weight", "momentum_buffer/model.norm.weight"})
    EXPECT_FALSE(tensors.count(name)) << name << " in " << index;
}

TEST_F(Train, ResumingUnderTheOtherOptimizerIsRefused) {
  for (const auto& [saved, other] : {std::pair{"adamw", "muon"}, std::pair{"muon", "adamw"}}) {
    const std::string folder = dir / saved;
    const CommandResult first = train(fmt::format(
        "{} --set training.steps=5 --set optimizer.name=\"{}\"", folder_arg(folder), saved));
    ASSERT_EQ(first.status, 0) << first.output;
    const CommandResult r =
        train(fmt::format("{} --set training.steps=10 --set optimizer.name=\"{}\" --resume",
                          folder_arg(folder), other));
    expect_error(r, {saved, other, "optimizer.name", "--init-from"});
    EXPECT_FALSE(fs::exists(folder + "/step_00000010")) << r.output;
    const CommandResult from =
        train(fmt::format("{} --set training.steps=2 --set optimizer.name=\"{}\" --init-from "
                          "{}/step_00000005",
                          folder_arg(dir / (std::string(saved) + "_init")), other, folder));
    EXPECT_EQ(from.status, 0) << from.output;
  }
}


// Issue 29, rule 7: a resume continues the same run. What changes the meaning of the saved data
// position (the batch shape, the seed, the data) or of the weights (the tokenizer) is refused
// naming the key, both values and the way forward; the same shards under another path are
// kept, said in one line.
TEST_F(Train, ResumeRefusesWhatChangesTheSavedState) {
  const CommandResult first = train("--set training.steps=2");
  ASSERT_EQ(first.status, 0) << first.output;
  write_learnable_shard(dir / "other.bin", 4000, 9);
  struct Change {
    std::string set, key, was, now;
  };
  const std::vector<Change> changes = {
      {"training.micro_batch_size=4", "training.micro_batch_size", "2", "4"},
      {"training.micro_batch_size=1", "training.micro_batch_size", "2", "1"},
      {"training.seq_len=8", "training.seq_len", "16", "8"},
      {"training.seq_len=32", "training.seq_len", "16", "32"},
      {"training.seed=8", "training.seed", "7", "8"},
      {"data.train=" + (dir / "other.bin"), "data.train", "\"" + (dir / "train.bin") + "\"",
       "\"" + (dir / "other.bin") + "\""},
  };
  for (const Change& c : changes) {
    SCOPED_TRACE(c.set);
    const CommandResult r = train("--resume --set training.steps=4 --set " + c.set);
    expect_error(r, {"--resume", c.key + " = " + c.was, "says " + c.now, "--init-from",
                     dir / "run/step_00000002", "saved position"});
  }
  EXPECT_EQ(entries_with_prefix(dir / "run", "step_"), std::vector<std::string>{"step_00000002"});
  // The same shard under another spelling of its path: kept, and said.
  fs::create_directories(dir / "moved");
  fs::copy_file(dir / "train.bin", dir / "moved/train.bin");
  const CommandResult moved =
      train("--resume --set training.steps=3 --set data.train=" + (dir / "moved/train.bin"));
  ASSERT_EQ(moved.status, 0) << moved.output;
  EXPECT_NE(moved.output.find("the same shards by name, size and token count, so the saved "
                              "position"),
            std::string::npos)
      << moved.output;
  // Another accumulation keeps the stream of windows and its position: said in one line.
  const CommandResult accumulated =
      train("--resume --set training.steps=4 --set training.grad_accum_steps=2 --set data.train=" +
            (dir / "moved/train.bin"));
  ASSERT_EQ(accumulated.status, 0) << accumulated.output;
  EXPECT_NE(accumulated.output.find("training.grad_accum_steps x parallel.dp is now 2 x 1 (was 1 "
                                    "x 1): the data continues from the saved position (epoch 0, "
                                    "shard 0, window 3), 2 windows a step instead of 1"),
            std::string::npos)
      << accumulated.output;
}

// A weighted mixture of two sources (data.train an array, data.weights): resumed bit for bit,
// one position per source saved, its sources and shares said on the first lines; another
// weighting or order of the sources on resume is refused, naming the key.
TEST_F(Train, AMixtureOfSourcesResumesBitExactAndKeepsItsWeights) {
  write_learnable_shard(dir / "small.bin", 8 * 32 + 1, 3);
  const std::string sources =
      fmt::format("--set 'data.train=[\"{}\", \"{}\"]'", dir / "train.bin", dir / "small.bin");
  const std::string mixture =
      "--set lr_scheduler.decay=constant " + sources + " --set 'data.weights=[1, 3]'";
  ASSERT_NO_FATAL_FAILURE(resume_matches(*this, dir / "a", dir / "b", mixture, 10, 20));
  const CommandResult a = train(folder_arg(dir / "c") + " " + mixture + " --set training.steps=1");
  ASSERT_EQ(a.status, 0) << a.output;
  EXPECT_NE(a.output.find(fmt::format("data.train: 2 sources: {} 25.0 % (124 windows per epoch), "
                                      "{} 75.0 % (8)",
                                      dir / "train.bin", dir / "small.bin")),
            std::string::npos)
      << a.output;
  // 10 steps of one window: 2.5 from train.bin, 7.5 from small.bin (8 windows per epoch).
  std::ifstream in(dir / "b/step_00000010/trainer_state.json");
  const auto state = nlohmann::json::parse(in);
  EXPECT_EQ(state.at("train_position").dump(), R"([{"epoch":0,"shard_index":0,"window_index":3},)"
                                               R"({"epoch":0,"shard_index":0,"window_index":7}])");
  const CommandResult reweighed =
      train(folder_arg(dir / "b") +
            " --resume --set training.steps=22 --set lr_scheduler.decay=constant " + sources +
            " --set 'data.weights=[1, 1]'");
  expect_error(reweighed, {"--resume", "data.weights = [1.0, 3.0]", "says [1.0, 1.0]",
                           "counted from the first step", "--init-from"});
  const CommandResult reordered = train(
      fmt::format("{} --resume --set training.steps=22 --set lr_scheduler.decay=constant --set "
                  "'data.train=[\"{}\", \"{}\"]' --set 'data.weights=[1, 3]'",
                  folder_arg(dir / "b"), dir / "small.bin", dir / "train.bin"));
  expect_error(reordered,
               {"--resume", "data.train = [", "whose shards differ: source 1",
                "each source of the checkpoint's shards",
                "source 1: epoch 0, shard 0, window 5; source 2: epoch 1, shard 0, window 7"});
}

// A huge learning rate without clipping breaks the model at step 2, in one of two ways
// depending on the lr and the data: the loss itself becomes NaN (written as null in JSON), or
// the activations overflow inside the norms so that the gradient norm is NaN while the loss
// stays finite (ln 64: all logits 0). With this data lr 1e6 gives the first, 1e30 the second.
class NonFinite : public Train, public ::testing::WithParamInterface<const char*> {
 public:
  std::string diverge() const {
    return fmt::format("--set optimizer.lr={} --set training.max_norm=0 --set training.steps=6",
                       GetParam());
  }
};

// The error comes after the step that was whole is saved: nothing trained is lost.
TEST_P(NonFinite, Stops) {
  const CommandResult r = train(diverge());
  expect_error(r, {"step 2", "on_nonfinite"});
  EXPECT_NE(r.output.find("step 1: checkpoint"), std::string::npos) << r.output;
  EXPECT_EQ(entries_with_prefix(dir / "run", "step_"), std::vector<std::string>{"step_00000001"});
  expect_complete_checkpoint(dir / "run/step_00000001");
  EXPECT_TRUE(entries_with_prefix(dir / "run", ".tmp-").empty());
}

// Rule 7 of issue 29: skipping has a limit of steps in a row, after which the run stops with an
// error naming the step (and saves the last whole one first).
TEST_P(NonFinite, SkipsAtMostTheLimitInARow) {
  for (const int limit : {0, 2}) {
    SCOPED_TRACE(limit);
    fs::remove_all(dir / "run");
    const CommandResult r =
        train(fmt::format("{} --set training.on_nonfinite=skip --set training.max_skipped_steps={}",
                          diverge(), limit));
    expect_error(r, {fmt::format("step {}:", 2 + limit), "in a row",
                     fmt::format("training.max_skipped_steps = {}", limit)});
    EXPECT_EQ(entries_with_prefix(dir / "run", "step_"),
              std::vector<std::string>{fmt::format("step_{:08d}", 1 + limit)});
  }
}

TEST_P(NonFinite, Skips) {
  const CommandResult r = train(diverge() + " --set training.on_nonfinite=skip");
  EXPECT_EQ(r.status, 0) << r.output;
  const Metrics m = read_metrics(dir / "run/metrics.jsonl");
  expect_steps_once(m, 6);
  EXPECT_FALSE(m.steps[0].skipped);
  for (size_t i = 1; i < m.steps.size(); ++i) {
    EXPECT_TRUE(m.steps[i].skipped) << "step " << m.steps[i].step;
    EXPECT_FALSE(std::isfinite(m.steps[i].loss) && std::isfinite(m.steps[i].grad_norm))
        << "step " << m.steps[i].step;
  }
  EXPECT_NE(r.output.find("step 2:"), std::string::npos) << r.output;
  EXPECT_EQ(entries_with_prefix(dir / "run", "step_"),
            (std::vector<std::string>{"step_00000005", "step_00000006"}));
  expect_complete_checkpoint(dir / "run/step_00000006");
  // The plot of a run with skipped steps.
  EXPECT_TRUE(is_png(dir / "run/loss.png"));
  EXPECT_TRUE(entries_with_prefix(dir / "run", "loss.png.").empty())
      << "plot temporaries left behind";
}

INSTANTIATE_TEST_SUITE_P(Lr, NonFinite, ::testing::Values("1e6", "1e30"), [](const auto& info) {
  return std::string(info.param).replace(1, 1, "_");
});

// ---------------------------------------------------------------------------------------
// 6. bottle plot.

// A printed line every log_freq steps: its tok/s and MFU are the interval's, time-weighted
// from the steps metrics.jsonl records (every step), with the tokens seen, the epoch, the
// time elapsed and the ETA. On a terminal the line is updated in place, except under a
// launcher (mpirun's pseudo-terminal), where every line is plain.
TEST_F(Train, ProgressLinesAverageTheirInterval) {
  const CommandResult r =
      train("--set training.steps=12 --set metrics.log_freq=5 --set training.eval_interval=0");
  ASSERT_EQ(r.status, 0) << r.output;
  std::vector<nlohmann::json> rows;  // metrics.jsonl's step lines
  std::ifstream jsonl(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(jsonl, line);)
    if (line.find("\"loss\"") != std::string::npos) rows.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(rows.size(), 12u);
  std::vector<std::string> printed;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);)
    if (line.starts_with("step ") && line.find("tok/s") != std::string::npos)
      printed.push_back(line);
  ASSERT_EQ(printed.size(), 3u) << r.output;  // steps 5, 10, 12
  size_t first = 0;
  for (size_t k = 0; k < printed.size(); ++k) {
    const size_t last = k < 2 ? 5 * (k + 1) : 12;
    double ms = 0.0, token_ms = 0.0, mfu_ms = 0.0;
    for (size_t i = first; i < last; ++i) {
      const nlohmann::json& row = rows[i];
      ms += row["ms"].get<double>();
      token_ms += row["tokens_per_s"].get<double>() * row["ms"].get<double>();
      mfu_ms += row["mfu"].is_number() ? row["mfu"].get<double>() * row["ms"].get<double>() : 0;
    }
    first = last;
    EXPECT_NE(printed[k].find(fmt::format("| {:.0f} tok/s |", token_ms / ms)), std::string::npos)
        << printed[k];
    if (rows[0]["mfu"].is_number()) {
      EXPECT_NE(printed[k].find(fmt::format("| MFU {:.1f}% |", 100.0 * mfu_ms / ms)),
                std::string::npos)
          << printed[k];
    }
    // micro_batch_size x seq_len per step, under a thousand: printed whole.
    const int64_t tokens = int64_t(last) * 2 * 16;
    EXPECT_EQ(rows[last - 1]["tokens_seen"], tokens);
    EXPECT_NE(printed[k].find(fmt::format("| tokens {} | epoch 1 |", tokens)), std::string::npos)
        << printed[k];
    EXPECT_NE(printed[k].find(" elapsed, ETA "), std::string::npos) << printed[k];
  }
  // On a terminal (script(1) gives one): updated in place; under a launcher: plain lines.
  const std::string folder = dir / "tty";
  for (const bool launched : {false, true}) {
    fs::remove_all(folder);
    const CommandResult t = run(fmt::format(
        "script -qec \"{}{} --set training.steps=6 --set metrics.log_freq=3 {}\" /dev/null",
        launched ? "OMPI_COMM_WORLD_SIZE=1 " : "", train_command(""), folder_arg(folder)));
    ASSERT_EQ(t.status, 0) << t.output;
    EXPECT_EQ(t.output.find("\x1b[K") != std::string::npos, !launched) << t.output;
  }
}

// inspect reads a run's folder, a checkpoint and data without loading a weight: what the
// checkpoints, the model, the step, the data position and the logged losses are.
TEST_F(Train, InspectTellsWhatARunHolds) {
  ASSERT_EQ(train("--set training.steps=10").status, 0);
  auto inspect = [&](const std::string& path) {
    const CommandResult r = run(fmt::format("{} inspect {} --json", bottle_binary(), path));
    EXPECT_EQ(r.status, 0) << r.output;
    return nlohmann::json::parse(r.output, nullptr, false);
  };
  std::map<int64_t, double> loss;  // metrics.jsonl's, by step
  std::ifstream jsonl(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(jsonl, line);)
    if (const auto j = nlohmann::json::parse(line); j.contains("loss"))
      loss[j["step"].get<int64_t>()] = j["loss"].get<double>();
  const nlohmann::json run_folder = inspect(dir / "run");
  EXPECT_EQ(run_folder["run"]["checkpoints"], nlohmann::json({5, 10})) << run_folder;
  EXPECT_EQ(run_folder["run"]["newest"], dir / "run/step_00000010");
  EXPECT_EQ(run_folder["run"]["logged"]["loss"].get<double>(), loss[10]);
  const nlohmann::json& model = run_folder["model"];
  EXPECT_EQ(model["kind"], "cola");
  EXPECT_EQ(model["training"]["step"], 10);
  EXPECT_EQ(model["training"]["seed"], 7);
  const nlohmann::json five = inspect(dir / "run/step_00000005");
  EXPECT_EQ(five["model"]["training"]["step"], 5);
  EXPECT_EQ(five["model"]["training"]["logged"]["loss"].get<double>(), loss[5]);
  EXPECT_EQ(five["model"]["training"]["data_position"]["window"], 5);
  EXPECT_EQ(five["model"]["parameters"], model["parameters"]);
  // Text, and errors naming what is wrong.
  const CommandResult text = run(fmt::format("{} inspect {}", bottle_binary(), dir / "run"));
  ASSERT_EQ(text.status, 0) << text.output;
  EXPECT_NE(text.output.find("2 checkpoint(s) (steps [5,10])"), std::string::npos) << text.output;
  EXPECT_NE(text.output.find("step 10 (10 optimizer steps), seed 7"), std::string::npos)
      << text.output;
  for (const auto& [path, needle] :
       {std::pair{dir / "nothing", dir / "nothing: no such file or directory"},
        std::pair{dir / "train.bin", dir / "train.bin: no split description"}}) {
    const CommandResult r = run(fmt::format("{} inspect {}", bottle_binary(), path));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find(needle), std::string::npos) << r.output;
  }
  std::ofstream(dir / "run/step_00000005/trainer_state.json") << "{\"step\": ";
  const CommandResult damaged =
      run(fmt::format("{} inspect {}", bottle_binary(), dir / "run/step_00000005"));
  EXPECT_EQ(damaged.status, 1) << damaged.output;
  EXPECT_NE(damaged.output.find(dir / "run/step_00000005/trainer_state.json"), std::string::npos)
      << damaged.output;
}

// metrics.tensorboard: TensorBoard's own reader finds every step's scalars once, equal to
// metrics.jsonl's, also after a resume from an earlier checkpoint than the last logged step.
TEST_F(Train, TensorBoardReadsTheEventFiles) {
  const std::string python = BOTTLE_SOURCE_DIR "/.venv/bin/python";
  ASSERT_TRUE(fs::exists(python)) << "no " << python << ": run scripts/setup.sh (it makes .venv)";
  ASSERT_EQ(train("--set training.steps=10 --set metrics.tensorboard=tb").status, 0);
  fs::remove_all(dir / "run/step_00000010");  // the run resumes from step 5, logs 6.. again
  const CommandResult resumed =
      train("--resume --set training.steps=12 --set metrics.tensorboard=tb");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  size_t files = 0;
  for (const auto& e : fs::directory_iterator(dir / "run/tb"))
    files += e.path().filename().string().starts_with("events.out.tfevents.");
  EXPECT_EQ(files, 2u);
  const CommandResult read = run(fmt::format("{} {}/tests/train/tensorboard_oracle.py {}", python,
                                             BOTTLE_SOURCE_DIR, dir / "run/tb"));
  ASSERT_EQ(read.status, 0) << read.output;
  const auto scalars = nlohmann::json::parse(read.output.substr(read.output.find('{')));
  std::map<int64_t, double> loss, val_loss;  // metrics.jsonl's, by step
  std::ifstream jsonl(dir / "run/metrics.jsonl");
  for (std::string line; std::getline(jsonl, line);) {
    const auto j = nlohmann::json::parse(line);
    (j.contains("loss") ? loss : val_loss)[j["step"].get<int64_t>()] =
        j.contains("loss") ? j["loss"].get<double>() : j["val_loss"].get<double>();
  }
  ASSERT_EQ(loss.size(), 12u);
  for (const auto& [tag, expected] : {std::pair{"train/loss", &loss}, {"val/loss", &val_loss}}) {
    SCOPED_TRACE(tag);
    ASSERT_TRUE(scalars.contains(tag)) << scalars.dump();
    const nlohmann::json& events = scalars[tag];
    ASSERT_EQ(events.size(), expected->size()) << events.dump();
    size_t i = 0;
    for (const auto& [step, value] : *expected) {
      EXPECT_EQ(events[i][0], step);
      EXPECT_EQ(events[i][1].get<double>(), double(float(value))) << "step " << step;
      ++i;
    }
  }
  for (const char* tag : {"train/lr", "train/grad_norm", "train/tokens_per_s"})
    EXPECT_EQ(scalars[tag].size(), 12u) << tag;
  // An event directory that is a file is refused by name.
  std::ofstream(dir / "notadir") << "x";
  const CommandResult bad =
      train(fmt::format("--set metrics.tensorboard={} {}", dir / "notadir", folder_arg(dir / "b")));
  EXPECT_EQ(bad.status, 1) << bad.output;
  EXPECT_NE(bad.output.find(dir / "notadir"), std::string::npos) << bad.output;
}

TEST_F(Train, PlotWritesAPng) {
  {
    std::ofstream out(dir / "metrics.jsonl");
    for (int s = 1; s <= 30; ++s) {
      out << nlohmann::json{{"step", s}, {"loss", 4.0 - 0.05 * s}, {"lr", 1e-3}}.dump() << "\n";
      if (s % 10 == 0)
        out << nlohmann::json{{"step", s}, {"val_loss", 4.1 - 0.05 * s}}.dump() << "\n";
    }
  }
  const CommandResult r = run(
      fmt::format("{} plot {} --out {}", bottle_binary(), dir / "metrics.jsonl", dir / "x.png"));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(is_png(dir / "x.png"));
  // Without --out: loss.png beside the metrics.
  const CommandResult beside =
      run(fmt::format("{} plot {}", bottle_binary(), dir / "metrics.jsonl"));
  ASSERT_EQ(beside.status, 0) << beside.output;
  EXPECT_TRUE(is_png(dir / "loss.png"));
}

TEST_F(Train, PlotOfNotJsonl) {
  std::ofstream(dir / "notes.txt") << "step 1 loss 4.0\nstep 2 loss 3.9\n";
  expect_error(
      run(fmt::format("{} plot {} --out {}", bottle_binary(), dir / "notes.txt", dir / "x.png")),
      {"notes.txt"});
  EXPECT_FALSE(fs::exists(dir / "x.png"));
  EXPECT_TRUE(entries_with_prefix(dir.str(), "x.png.").empty()) << "plot temporaries left behind";
}

// ---------------------------------------------------------------------------------------
// bench step times the step `bottle train` takes (train/train_step.h): from the same weights
// (training.seed) and the same batch, two steps of each give the same loss, gradient norm,
// learning rate and updated weights, to the last bit. bench step holds the rate at
// optimizer.lr, so training runs here at a constant rate too.

nlohmann::json last_json_line(const std::string& output) {
  const size_t brace = output.rfind("\n{");
  const std::string line = output.substr(brace == std::string::npos ? 0 : brace + 1);
  return nlohmann::json::parse(line.substr(0, line.find('\n')));
}

// The flat parameter buffer of the model in `dir` (config.json + model.safetensors).
std::vector<char> parameter_bytes(const std::string& dir) {
  const std::unique_ptr<LlamaModel> model = load_model(dir);
  const Tensor values = model->parameters().values();
  const char* bytes = static_cast<const char*>(values.data);
  return std::vector<char>(bytes, bytes + values.nbytes());
}

TEST_F(Train, BenchStepTakesTrainsStepBitForBit) {
  const std::string bench = dir / "bench", folder = dir / "trained";
  // max_norm 0.5 clips every step of both (checked below).
  const std::string clip = "--set training.max_norm=0.5";
  // As many threads as the training run gets (OpenMP's default here: OMP_NUM_THREADS, else
  // the cores): a reduction split over another count of threads adds in another order.
  const CommandResult b =
      run(fmt::format("{} bench step {} {} --steps 2 --warmup 0 --torch false --threads {} --json "
                      "--save {}",
                      bottle_binary(), dir / "tiny.toml", clip, omp_get_max_threads(), bench));
  ASSERT_EQ(b.status, 0) << b.output;
  const nlohmann::json row = last_json_line(b.output);
  // The tokens bench step stepped on: one window of b·s + 1 tokens, which every training step
  // reads (each epoch holds that one batch).
  const CommandResult t =
      train(fmt::format("{} {} --set training.steps=2 --set data.train={}/cola/tokens.bin --set "
                        "lr_scheduler.warmup_steps=0 --set lr_scheduler.decay=constant --set "
                        "training.eval_interval=0",
                        folder_arg(folder), clip, bench));
  ASSERT_EQ(t.status, 0) << t.output;
  const Metrics m = read_metrics(folder + "/metrics.jsonl");
  expect_steps_once(m, 2);
  const StepRow& last = m.steps.back();
  ASSERT_TRUE(std::isfinite(last.loss));
  EXPECT_GT(last.grad_norm, 0.5) << "the step should clip";
  EXPECT_EQ(last.loss, row.at("loss").get<double>());
  EXPECT_EQ(last.grad_norm, row.at("grad_norm").get<double>());
  EXPECT_EQ(last.lr, row.at("lr").get<double>());
  const std::vector<char> benched = parameter_bytes(bench + "/cola"),
                          trained = parameter_bytes(folder + "/step_00000002");
  ASSERT_EQ(benched.size(), trained.size());
  EXPECT_EQ(std::memcmp(benched.data(), trained.data(), benched.size()), 0)
      << "the updated weights differ";
}

// bench step --optimizers gives a row per optimizer, Muon's against AdamW's, and --save writes
// each kind's model once (its first row's) however many optimizers and precisions run.
TEST_F(Train, BenchStepRowsPerOptimizerSaveOnce) {
  const std::string bench = dir / "bench";
  const CommandResult b =
      run(fmt::format("{} bench step {} --steps 1 --warmup 0 --torch false --json --precision "
                      "fp32,bf16 --optimizers muon,adamw --save {}",
                      bottle_binary(), dir / "tiny.toml", bench));
  ASSERT_EQ(b.status, 0) << b.output;
  const nlohmann::json row = last_json_line(b.output);
  EXPECT_EQ(row.at("optimizer"), "muon") << b.output;
  EXPECT_GT(row.at("step_vs_adamw").get<double>(), 0) << b.output;
  EXPECT_GT(row.at("optimizer_ms_per_step").get<double>(), 0) << b.output;
  EXPECT_TRUE(fs::exists(bench + "/cola/model.safetensors"));
}

TEST_F(Train, PlotOfMissingFile) {
  expect_error(run(fmt::format("{} plot {} --out {}", bottle_binary(), dir / "nothing.jsonl",
                               dir / "x.png")),
               {"nothing.jsonl"});
}

}  // namespace
}  // namespace bottle::testing
