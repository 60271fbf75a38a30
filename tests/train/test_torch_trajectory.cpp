// Whole training runs against PyTorch: `bottle train` for 20 steps from a checkpoint that
// tools/torch_reference.py wrote, and `torch_reference.py --train` for the same 20 steps from
// the same weights on the same tokens, then every step's loss and learning rate and every
// final weight compared. One row per model kind (none, CoLA, LaX) and optimizer (AdamW, Muon).
// Fails, never skips, when /usr/bin/python3 or torch is missing.
//
// Tolerance. bottle trains in fp32; the oracle runs in float64 (the truth) and twice in fp32:
// once from the checkpoint and once from it with every weight moved one fp32 ulp (a rounding
// the first step could have made). The larger of the two fp32 runs' distances from float64 is
// how far rounding alone carries a correct fp32 run over these steps, and bottle must stay
// within 4 times it, plus 4 fp32 ulps of the values compared. Two fp32 runs rather than one:
// over 20 steps a trajectory amplifies its rounding by an amount that varies from run to run
// (most in LaX), and one run's distance can fall well below another's.
//
// The settings keep that amplification small: Adam's eps is 1e-5, above the rounding noise of
// the gradients, whose smallest elements would otherwise get a full step of random sign from
// AdamW in one run and none in the other. Every optimizer setting differs from bottle's
// default, so a key bottle ignored would show. The checker itself must be able to fail: the
// NegativeControl case gives bottle a weight decay 10% off the oracle's and expects it caught.
//
// The Muon rows set Muon's own keys off their defaults too (momentum 0.9, 4 Newton-Schulz
// steps; Nesterov momentum in all but the LaX row, which takes the plain buffer), given to the
// oracle alike.
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "io/safetensors.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

// Tiny GEMMs on a busy machine: spinning OpenMP workers make every run ~10x slower. The
// bottle processes inherit this.
const bool passive_omp = [] { return ::setenv("OMP_WAIT_POLICY", "passive", 0) == 0; }();

constexpr int64_t kSteps = 20, kBatch = 4, kSeq = 32, kVocab = 64;
constexpr int64_t kWindows = 8;  // per epoch: the 20 steps read two and a half epochs
constexpr double kFactor = 4.0;  // bottle's distance over the fp32 runs' at most
constexpr int kFloorUlps = 4;    // plus this many fp32 ulps of the values compared

// The run's settings, written once into both the TOML and the oracle's command line.
struct Settings {
  double lr = 1e-3, weight_decay = 0.05, beta1 = 0.85, beta2 = 0.98, eps = 1e-5;
  double max_norm = 0.8;  // some steps clip, some do not
  int64_t warmup_steps = 3;
  const char* decay = "cosine";
  double min_lr_ratio = 0.2;
  int64_t seed = 4321;  // training.seed: the order of the windows in each epoch
};

struct TrajectoryCase {
  const char* kind;  // model.bottleneck
  int64_t kv_heads;
  bool tied;
  const char* optimizer;  // "adamw" or "muon"
};

std::string row_name(const TrajectoryCase& c) {
  return fmt::format("{}_{}_{}_{}", c.kind, c.kv_heads == 4 ? "MHA" : "GQA",
                     c.tied ? "tied" : "untied", c.optimizer);
}
std::string case_name(const ::testing::TestParamInfo<TrajectoryCase>& info) {
  return row_name(info.param);
}
// GoogleTest prints a failed row's parameter with this rather than as bytes.
void PrintTo(const TrajectoryCase& c, std::ostream* os) { *os << row_name(c); }

// Muon's settings of a row: off their defaults, Nesterov but in the LaX row.
bool is_muon(const TrajectoryCase& c) { return std::string(c.optimizer) == "muon"; }
bool muon_nesterov(const TrajectoryCase& c) { return std::string(c.kind) != "lax"; }
constexpr double kMuonMomentum = 0.9;
constexpr int kMuonNsSteps = 4;

// The [optimizer] section's Muon lines of a row ("" for AdamW's).
std::string muon_keys(const TrajectoryCase& c) {
  if (!is_muon(c)) return "";
  return fmt::format(
      "name = \"muon\"\nmuon_momentum = {}\nmuon_ns_steps = {}\nmuon_nesterov = {}\n",
      kMuonMomentum, kMuonNsSteps, muon_nesterov(c));
}

std::string toml(const TrajectoryCase& c, const Settings& s, const TempDir& dir) {
  const bool lowrank = std::string(c.kind) != "none";
  return fmt::format(
      R"([model]
vocab_size = {}
hidden_size = 32
intermediate_size = 48
num_layers = 2
num_heads = 4
num_kv_heads = {}
bottleneck = "{}"
{}tie_embeddings = {}
max_seq_len = 64

[training]
steps = {}
micro_batch_size = {}
seq_len = {}
seed = {}
max_norm = {}
eval_interval = 0

[optimizer]
{}lr = {}
weight_decay = {}
beta1 = {}
beta2 = {}
eps = {}

[lr_scheduler]
warmup_steps = {}
decay = "{}"
min_lr_ratio = {}

[data]
train = "{}"

[checkpoint]
folder = "{}"

[metrics]
plot = ""
)",
      kVocab, c.kv_heads, c.kind, lowrank ? "rank = 8\n" : "", c.tied, kSteps, kBatch, kSeq, s.seed,
      s.max_norm, muon_keys(c), s.lr, s.weight_decay, s.beta1, s.beta2, s.eps, s.warmup_steps,
      s.decay, s.min_lr_ratio, dir / "tokens.bin", dir / "run");
}

std::string oracle_command(const TrajectoryCase& c, const Settings& s, const TempDir& dir,
                           const char* dtype, int jitter, const std::string& out) {
  return fmt::format(
             "{} --checkpoint {} --data {} --batch {} --seq {} --train --steps {} --out {} --dtype "
             "{} "
             "--jitter {} --optimizer {} --lr {} --weight-decay {} --beta1 {} --beta2 {} --eps {} "
             "--max-norm {} --warmup-steps {} --decay {} --min-lr-ratio {} --seed {}",
             torch_reference(), dir / "model", dir / "tokens.bin", kBatch, kSeq, kSteps, out, dtype,
             jitter, c.optimizer, s.lr, s.weight_decay, s.beta1, s.beta2, s.eps, s.max_norm,
             s.warmup_steps, s.decay, s.min_lr_ratio, s.seed) +
         (is_muon(c) ? fmt::format(" --muon-momentum {} --muon-ns-steps {} --muon-nesterov {}",
                                   kMuonMomentum, kMuonNsSteps, muon_nesterov(c))
                     : "");
}

// One oracle run's output: its final weights and its per-step JSON lists.
struct OracleRun {
  std::unique_ptr<SafeTensorsReader> weights;
  std::vector<double> losses, lrs, grad_norms;
  std::vector<bool> skipped;
};

OracleRun read_oracle(const std::string& path) {
  OracleRun r;
  r.weights = std::make_unique<SafeTensorsReader>(path);
  const auto& meta = r.weights->metadata();
  auto list = [&](const char* key) { return nlohmann::json::parse(meta.at(key)); };
  r.losses = list("losses").get<std::vector<double>>();
  r.lrs = list("lrs").get<std::vector<double>>();
  r.grad_norms = list("grad_norms").get<std::vector<double>>();
  r.skipped = list("skipped").get<std::vector<bool>>();
  return r;
}

struct BottleStep {
  double loss, lr;
  bool skipped;
};

std::vector<BottleStep> read_metrics(const std::string& path) {
  std::vector<BottleStep> steps;
  std::ifstream in(path);
  EXPECT_TRUE(in) << path;
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (!j.contains("loss")) continue;
    EXPECT_EQ(j.at("step").get<int64_t>(), int64_t(steps.size()) + 1) << line;
    // nlohmann::json writes NaN as null.
    const double loss = j.at("loss").is_null() ? NAN : j.at("loss").get<double>();
    steps.push_back({loss, j.at("lr").get<double>(), j.at("skipped").get<bool>()});
  }
  return steps;
}

std::vector<float> read_all(const SafeTensorsReader& r, const std::string& name) {
  std::vector<float> v(size_t(r.entry(name).numel()));
  r.read_f32(name, v);
  return v;
}

double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

double max_abs(const std::vector<float>& a) {
  double m = 0.0;
  for (float x : a) m = std::max(m, std::fabs(double(x)));
  return m;
}

// The distance between two adjacent floats at |x|.
double ulp(double x) {
  const float f = std::fabs(float(x));
  return double(std::nextafter(f, std::numeric_limits<float>::infinity())) - double(f);
}

// What the comparison found: its failures (empty when bottle is within the tolerance) and the
// figures it prints.
struct Comparison {
  bool compared = false;  // false: a run failed before there was anything to compare
  std::vector<std::string> failures;
  std::vector<std::string> weight_failures;
  // The largest distances from float64: the loss's over the steps, the weights' over the
  // tensors (relative to each tensor's largest value).
  double loss_bottle = 0, loss_fp32 = 0, weight_bottle = 0, weight_fp32 = 0;
  double worst_ratio = 0;  // the worst tensor's distance in bottle over its tolerance
  std::string worst_tensor;
  int clipped = 0;  // steps whose gradient norm was over max_norm
};

Comparison compare(const std::vector<BottleStep>& bottle, const SafeTensorsReader& bottle_weights,
                   const OracleRun& f64, const OracleRun& f32, const OracleRun& jittered,
                   double max_norm) {
  Comparison c;
  c.compared = true;
  auto fail = [&](std::string what) { c.failures.push_back(std::move(what)); };
  if (bottle.size() != size_t(kSteps) || f64.losses.size() != size_t(kSteps) ||
      f32.losses.size() != size_t(kSteps) || jittered.losses.size() != size_t(kSteps)) {
    fail(fmt::format("steps: bottle {}, oracle {} / {} / {}, want {}", bottle.size(),
                     f64.losses.size(), f32.losses.size(), jittered.losses.size(), kSteps));
    return c;
  }
  // Per step: the same learning rate to the bit (the oracle rounds its schedule's rate to a
  // float as bottle does), no step skipped, and the loss within 4 times the fp32 runs' largest
  // distance up to that step.
  double envelope = 0.0;
  for (int64_t k = 0; k < kSteps; ++k) {
    const size_t i = size_t(k);
    if (bottle[i].lr != f64.lrs[i])
      fail(fmt::format("step {}: lr {} in bottle, {} in the oracle", k + 1, bottle[i].lr,
                       f64.lrs[i]));
    if (bottle[i].skipped || f64.skipped[i])
      fail(fmt::format("step {}: skipped (bottle {}, oracle {})", k + 1, bottle[i].skipped,
                       bool(f64.skipped[i])));
    c.clipped += f64.grad_norms[i] > max_norm;
    envelope = std::max({envelope, std::fabs(f32.losses[i] - f64.losses[i]),
                         std::fabs(jittered.losses[i] - f64.losses[i])});
    const double distance = std::fabs(bottle[i].loss - f64.losses[i]);
    const double tolerance = kFactor * envelope + kFloorUlps * ulp(f64.losses[i]);
    c.loss_bottle = std::max(c.loss_bottle, distance);
    c.loss_fp32 = envelope;
    if (!(distance <= tolerance))
      fail(
          fmt::format("step {}: loss {:.9f} in bottle, {:.9f} in float64: {:.2e} apart, over "
                      "{:.2e} (the fp32 runs' {:.2e} so far)",
                      k + 1, bottle[i].loss, f64.losses[i], distance, tolerance, envelope));
  }
  // Every weight after the last step.
  for (const auto& [name, entry] : f64.weights->entries()) {
    if (!bottle_weights.contains(name)) {
      fail(fmt::format("{}: not in bottle's export", name));
      continue;
    }
    const std::vector<float> truth = read_all(*f64.weights, name),
                             b = read_all(bottle_weights, name);
    if (b.size() != truth.size()) {
      fail(fmt::format("{}: {} values in bottle's export, {} in the oracle's", name, b.size(),
                       truth.size()));
      continue;
    }
    const double fp32 = std::max(max_abs_difference(read_all(*f32.weights, name), truth),
                                 max_abs_difference(read_all(*jittered.weights, name), truth));
    const double distance = max_abs_difference(b, truth), scale = std::max(max_abs(truth), 1e-30);
    const double tolerance = kFactor * fp32 + kFloorUlps * ulp(scale);
    c.weight_bottle = std::max(c.weight_bottle, distance / scale);
    c.weight_fp32 = std::max(c.weight_fp32, fp32 / scale);
    if (distance / tolerance > c.worst_ratio)
      c.worst_ratio = distance / tolerance, c.worst_tensor = name;
    if (!(distance <= tolerance))
      c.weight_failures.push_back(fmt::format(
          "{}: {:.2e} from float64 in bottle, over {:.2e} (the fp32 runs' {:.2e}; scale {:.2e})",
          name, distance, tolerance, fp32, scale));
  }
  for (const auto& [name, entry] : bottle_weights.entries())
    if (!f64.weights->contains(name)) fail(fmt::format("{}: in bottle's export only", name));
  c.failures.insert(c.failures.end(), c.weight_failures.begin(), c.weight_failures.end());
  return c;
}

// Trains with bottle (with `bottle_args` after the configuration) and with the oracle three
// times, all four at once, then compares.
Comparison train_and_compare(const TrajectoryCase& tc, const Settings& s,
                             const std::string& bottle_args = "") {
  TempDir dir;
  write_random_shard(dir / "tokens.bin", kWindows * kBatch * kSeq + 1, kVocab, 11);
  const CommandResult created = run(fmt::format(
      "{} --create {} --hidden 32 --intermediate 48 --layers 2 --heads 4 --kv-heads {} --vocab {} "
      "--kind {} --rank 8 --seed 5{}",
      torch_reference(), dir / "model", tc.kv_heads, kVocab, tc.kind, tc.tied ? " --tied" : ""));
  EXPECT_EQ(created.status, 0) << "the PyTorch reference failed (is python3-torch installed?):\n"
                               << created.output;
  if (created.status != 0) return {};
  std::ofstream(dir / "run.toml") << toml(tc, s, dir);
  // Each run's output in its own log; the shell waits for all four.
  const std::string jobs = fmt::format(
      "{} train {} --init-from {} {} >{} 2>&1 & b=$!; {} >{} 2>&1 & p=$!; {} >{} 2>&1 & q=$!; "
      "{} >{} 2>&1; wait $p; wait $q; wait $b",
      bottle_binary(), dir / "run.toml", dir / "model", bottle_args, dir / "bottle.log",
      oracle_command(tc, s, dir, "f64", 0, dir / "f64.safetensors"), dir / "f64.log",
      oracle_command(tc, s, dir, "f32", 0, dir / "f32.safetensors"), dir / "f32.log",
      oracle_command(tc, s, dir, "f32", 1, dir / "jittered.safetensors"), dir / "jittered.log");
  run(jobs);
  auto log = [&](const std::string& name) {
    std::ifstream in(dir / name);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  // What each run left tells whether it succeeded: the oracle writes its output last, bottle
  // its final checkpoint.
  Comparison failed;
  for (const char* run_name : {"f64", "f32", "jittered"})
    if (!fs::exists(dir / (std::string(run_name) + ".safetensors")))
      failed.failures.push_back(fmt::format("the PyTorch reference ({}) failed:\n{}", run_name,
                                            log(std::string(run_name) + ".log")));
  if (!fs::exists(fmt::format("{}/step_{:08d}", dir / "run", kSteps)))
    failed.failures.push_back("bottle train failed:\n" + log("bottle.log"));
  if (!failed.failures.empty()) return failed;
  const CommandResult exported =
      run(fmt::format("{} export --checkpoint {}/step_{:08d} --out {}", bottle_binary(),
                      dir / "run", kSteps, dir / "exported"));
  if (exported.status != 0) {
    failed.failures.push_back("bottle export failed:\n" + exported.output);
    return failed;
  }
  const SafeTensorsReader bottle_weights(dir / "exported/model.safetensors");
  return compare(read_metrics(dir / "run/metrics.jsonl"), bottle_weights,
                 read_oracle(dir / "f64.safetensors"), read_oracle(dir / "f32.safetensors"),
                 read_oracle(dir / "jittered.safetensors"), s.max_norm);
}

void print(const std::string& row, const Comparison& c) {
  if (!c.compared) return;
  std::printf(
      "%s: loss from float64: bottle %.2e, fp32 runs %.2e; weights from float64 (relative to "
      "each tensor's largest): bottle %.2e, fp32 runs %.2e; worst tensor %s at %.2f of its "
      "tolerance; %d of %d steps clipped\n",
      row.c_str(), c.loss_bottle, c.loss_fp32, c.weight_bottle, c.weight_fp32,
      c.worst_tensor.c_str(), c.worst_ratio, c.clipped, int(kSteps));
}

class TorchTrajectory : public ::testing::TestWithParam<TrajectoryCase> {};

TEST_P(TorchTrajectory, LossesAndFinalWeightsMatch) {
  const Comparison c = train_and_compare(GetParam(), Settings{});
  print(row_name(GetParam()), c);
  std::string all;
  for (const std::string& f : c.failures) all += f + "\n";
  EXPECT_TRUE(c.failures.empty()) << all;
}

INSTANTIATE_TEST_SUITE_P(KindsAndOptimizers, TorchTrajectory,
                         ::testing::Values(TrajectoryCase{"none", 2, false, "adamw"},
                                           TrajectoryCase{"cola", 4, true, "adamw"},
                                           TrajectoryCase{"lax", 4, false, "adamw"},
                                           TrajectoryCase{"none", 2, false, "muon"},
                                           TrajectoryCase{"cola", 4, true, "muon"},
                                           TrajectoryCase{"lax", 4, false, "muon"}),
                         case_name);

// The checker catches a discrepancy: bottle's weight decay 10% above the oracle's (0.055
// against 0.05) moves the weights far outside the tolerance.
TEST(TorchTrajectoryNegativeControl, AWeightDecayTenPercentOffIsCaught) {
  const Settings s;
  const Comparison c =
      train_and_compare({"cola", 4, true, "adamw"}, s,
                        fmt::format("--set optimizer.weight_decay={}", s.weight_decay * 1.1));
  print("cola_MHA_tied_adamw, bottle's weight decay 10% off", c);
  EXPECT_FALSE(c.weight_failures.empty()) << "a weight decay 10% off went unnoticed";
  EXPECT_GT(c.worst_ratio, 10.0);
}

}  // namespace
}  // namespace bottle::testing
