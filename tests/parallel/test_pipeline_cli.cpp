// 3D parallelism end to end under mpirun: every tp x pp x dp layout trains like one process
// with the same global batch, checkpoints resume on another layout, 1F1B keeps fewer
// micro-batches alive than GPipe, and a rank that dies ends the whole job.
#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <tuple>

#include "model/sharded_checkpoint.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

std::vector<nlohmann::json> steps_of(const std::string& metrics) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("loss")) rows.push_back(j);
  }
  return rows;
}

// The .safetensors files of two checkpoint folders, byte for byte (every file of `a` has a
// twin in `b`).
// The same values in two checkpoints, tensor by tensor (weights and moments), however each
// run's ranks split them into pieces (a ZeRO rank writes its own slices: docs/design.md §12).
void expect_same_tensors(const std::string& a, const std::string& b) {
  const ShardedCheckpoint x(a), y(b);
  EXPECT_EQ(x.names(), y.names()) << a << " and " << b << " hold other tensors";
  for (const std::string& name : x.names()) {
    if (!y.contains(name)) continue;
    const std::vector<float> u = x.read_whole(name), v = y.read_whole(name);
    EXPECT_TRUE(u.size() == v.size() && std::memcmp(u.data(), v.data(), u.size() * 4) == 0)
        << name << " of " << a << " differs from its twin in " << b;
  }
  EXPECT_FALSE(x.names().empty()) << a;
}

// Issue 57: every tag's measured peak within its plan, on every rank of every logged step
// (metrics.jsonl's "memory" against "memory_plan"): training.memory_limit means what it says,
// through a save too (each row after a checkpoint's step includes the save's buffers), in bf16
// too (the cpu backend's slabs and widened GEMM operands, docs/design.md §10).
void expect_peaks_within_plan(const std::vector<nlohmann::json>& rows, const std::string& what) {
  ASSERT_FALSE(rows.empty()) << what;
  for (const nlohmann::json& row : rows) {
    const nlohmann::json &peaks = row.at("memory"), &plan = row.at("memory_plan");
    for (const auto& [tag, per_rank] : plan.items()) {
      ASSERT_EQ(peaks.at(tag).size(), per_rank.size()) << what;
      for (size_t r = 0; r < per_rank.size(); ++r)
        EXPECT_LE(peaks.at(tag)[r].get<size_t>(), per_rank[r].get<size_t>())
            << what << ": step " << row.at("step") << ", rank " << r << ", tag " << tag
            << " measured above its plan";
    }
  }
}

class PipelineCli : public ::testing::Test {
 public:
  void SetUp() override {
    write_random_shard(dir / "train.bin", 40000, 64, 1);
    std::ofstream(dir / "tiny.toml") << fmt::format(R"([model]
vocab_size = 64
hidden_size = 32
intermediate_size = 48
num_layers = 4
num_heads = 4
bottleneck = "cola"
rank = 8
max_seq_len = 64

[training]
steps = 10
micro_batch_size = 2
seq_len = 16
grad_accum_steps = 4
eval_interval = 0

[optimizer]
lr = 1e-3

[data]
train = "{}"

[checkpoint]
interval = 0

[metrics]
log_freq = 1
)",
                                                    dir / "train.bin");
  }
  // Trains in `folder` on tp x pp x dp ranks; the global batch stays 4 micro-batches. `env`
  // (VAR=value ...) is the ranks' environment beside the test's.
  CommandResult train(int tp, int pp, int dp, const std::string& folder, const std::string& more,
                      const std::string& env = "") {
    const std::string sets = fmt::format(
        "--set parallel.tp={} --set parallel.pp={} --set parallel.dp={} --set "
        "training.grad_accum_steps={} --set checkpoint.folder={} {}",
        tp, pp, dp, 4 / dp, dir / folder, more);
    return run(fmt::format("{} {} {} train {} {}", env, mpirun(tp * pp * dp), bottle_binary(),
                           dir / "tiny.toml", sets));
  }
  TempDir dir;
};

struct Layout {
  int tp, pp, dp;
  const char* extra;
};

class Layouts : public PipelineCli, public ::testing::WithParamInterface<Layout> {};

// 10 steps on each layout, for each TP mode that fits: the same losses as one process (in
// bf16, against one process in bf16: within 1e-2 relative).
TEST_P(Layouts, TenStepsMatchOneProcess) {
  const Layout l = GetParam();
  const bool lax = std::string(l.extra).find("lax") != std::string::npos;
  const bool bf16 = std::string(l.extra).find("precision=bf16") != std::string::npos;
  for (const std::string model : {"full", "vanilla", "btp"}) {
    if (lax && model == "full") continue;  // LaX is a bottleneck model
    const std::string sets = model == "full"
                                 ? "--set model.bottleneck=none --set parallel.tp_mode=full"
                                 : "--set parallel.tp_mode=" + model;
    // The model's own switches (tying, kind) go to the one-process run too.
    const std::string tied = std::string(l.extra).find("model.") != std::string::npos
                                 ? " " + std::string(l.extra)
                             : bf16 ? " --set training.precision=bf16"
                                    : "";
    const CommandResult one = train(1, 1, 1, "one_" + model, sets + tied);
    ASSERT_EQ(one.status, 0) << one.output;
    // A checkpoint at step 5: the rows after it show the save's memory.
    const CommandResult many = train(l.tp, l.pp, l.dp, "many_" + model,
                                     sets + " --set checkpoint.interval=5 " + std::string(l.extra));
    ASSERT_EQ(many.status, 0) << many.output;
    const auto a = steps_of(dir / ("one_" + model + "/metrics.jsonl"));
    const auto b = steps_of(dir / ("many_" + model + "/metrics.jsonl"));
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u) << many.output;
    expect_peaks_within_plan(b, model + " " + std::string(l.extra));
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      const double want = a[i].at("loss").get<double>(), got = b[i].at("loss").get<double>();
      EXPECT_NEAR(got, want, bf16 ? 1e-2 * std::fabs(want) : 1e-4) << model << " step " << i + 1;
      worst = std::max(worst, std::fabs(got - want) / std::fabs(want));
    }
    if (bf16)
      std::printf("%s bf16 %dx%dx%d: max relative |loss - one process's| over 10 steps %.2e\n",
                  model.c_str(), l.tp, l.pp, l.dp, worst);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tp_Pp_Dp, Layouts,
    ::testing::Values(Layout{1, 2, 1, ""}, Layout{1, 4, 1, "--set parallel.schedule=gpipe"},
                      Layout{2, 2, 1, ""}, Layout{1, 2, 2, "--set parallel.zero=1"},
                      Layout{2, 1, 2, ""},
                      // ZeRO-1 over buckets of ~1k gradients: each rank owns slices of many.
                      Layout{2, 2, 2, "--set parallel.zero=1 --set parallel.bucket_mb=0.004"},
                      Layout{2, 2, 1, "--set model.tie_embeddings=true"},
                      // LaX's crossing spans the stage boundary: its latents travel too.
                      Layout{2, 2, 1, "--set model.bottleneck=lax"},
                      Layout{2, 2, 1, "--set training.precision=bf16"},
                      Layout{1, 2, 2, "--set parallel.zero=1 --set training.precision=bf16"},
                      // ZeRO-2: each micro-batch's gradients reduce-scattered block by block,
                      // the tied table's kept whole for the step.
                      Layout{1, 2, 2, "--set parallel.zero=2 --set model.tie_embeddings=true"},
                      // ZeRO-3: the parameters too, gathered per block before its forward and
                      // its backward, beside TP.
                      Layout{2, 1, 2, "--set parallel.zero=3"}),
    [](const auto& info) {
      const std::string extra = info.param.extra;
      return fmt::format("{}x{}x{}{}", info.param.tp, info.param.pp, info.param.dp,
                         extra.find("zero=2") != std::string::npos   ? "_zero2"
                         : extra.find("zero=3") != std::string::npos ? "_zero3"
                         : extra.find("tie") != std::string::npos    ? "_tied"
                         : extra.find("lax") != std::string::npos    ? "_lax"
                         : extra.find("bf16") != std::string::npos   ? "_bf16"
                                                                     : "");
    });

// Issue 58: Muon's update does not depend on the layout. Each matrix's Newton–Schulz runs on
// Gram matrices all-reduced over the TP group (btp's factors, full-rank TP's MLP weights), or on
// the matrix gathered (vanilla TP's factors, the square attention weights), so 10 steps of
// every TP mode (TP 2 and 4), a pipeline, DP replicas, LaX and bf16 give one process's losses
// (bf16 against one process in bf16: within 1e-2 relative) and, in fp32, its weights to fp32
// rounding; each tag's peak stays within its plan (the iteration's scratch is planned).
class MuonLayouts : public PipelineCli, public ::testing::WithParamInterface<Layout> {};

TEST_P(MuonLayouts, TenStepsMatchOneProcess) {
  const Layout l = GetParam();
  const std::string extra = l.extra;
  const bool lax = extra.find("lax") != std::string::npos;
  const bool bf16 = extra.find("precision=bf16") != std::string::npos;
  for (const std::string model : {"full", "vanilla", "btp"}) {
    if (lax && model == "full") continue;
    const std::string sets =
        (model == "full" ? "--set model.bottleneck=none --set parallel.tp_mode=full"
                         : "--set parallel.tp_mode=" + model) +
        " --set optimizer.name=\"muon\" --set checkpoint.interval=5 " + extra;
    const CommandResult one = train(1, 1, 1, "one_" + model, sets);
    ASSERT_EQ(one.status, 0) << one.output;
    const CommandResult many = train(l.tp, l.pp, l.dp, "many_" + model, sets);
    ASSERT_EQ(many.status, 0) << many.output;
    const auto a = steps_of(dir / ("one_" + model + "/metrics.jsonl"));
    const auto b = steps_of(dir / ("many_" + model + "/metrics.jsonl"));
    ASSERT_EQ(a.size(), 10u) << one.output;
    ASSERT_EQ(b.size(), 10u) << many.output;
    expect_peaks_within_plan(b, model + " muon " + extra);
    for (size_t i = 0; i < a.size(); ++i) {
      const double want = a[i].at("loss").get<double>(), got = b[i].at("loss").get<double>();
      EXPECT_NEAR(got, want, bf16 ? 1e-2 * std::fabs(want) : 1e-4) << model << " step " << i + 1;
    }
    if (bf16) continue;
    const ShardedCheckpoint x(dir / ("one_" + model + "/step_00000010")),
        y(dir / ("many_" + model + "/step_00000010"));
    double worst = 0;
    for (const std::string& name : x.names()) {
      if (name.find('/') != std::string::npos) continue;  // the optimizer's state
      const std::vector<float> u = x.read_whole(name), v = y.read_whole(name);
      ASSERT_EQ(u.size(), v.size()) << name;
      for (size_t i = 0; i < u.size(); ++i) worst = std::max(worst, double(std::fabs(u[i] - v[i])));
    }
    EXPECT_LT(worst, 1e-5) << model << ": the weights after 10 steps differ from one process's";
    std::printf("muon %s %dx%dx%d %s: max |weight - one process's| after 10 steps %.2e\n",
                model.c_str(), l.tp, l.pp, l.dp, extra.c_str(), worst);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Tp_Pp_Dp, MuonLayouts,
    ::testing::Values(Layout{2, 1, 1, ""}, Layout{4, 1, 1, ""}, Layout{1, 2, 1, ""},
                      Layout{1, 1, 2, ""}, Layout{2, 2, 1, "--set model.bottleneck=lax"},
                      Layout{2, 1, 1, "--set training.precision=bf16"},
                      // ZeRO: each matrix's Newton–Schulz on its owner, over buckets of ~1k
                      // elements that cut matrices between the ranks, beside TP and a pipeline.
                      Layout{1, 1, 2, "--set parallel.zero=1 --set parallel.bucket_mb=0.004"},
                      Layout{2, 1, 2, "--set parallel.zero=2 --set parallel.bucket_mb=0.004"},
                      Layout{1, 2, 2, "--set parallel.zero=3 --set parallel.bucket_mb=0.004"},
                      Layout{1, 1, 2,
                             "--set parallel.zero=1 --set parallel.bucket_mb=0.004 --set "
                             "training.precision=bf16"}),
    [](const auto& info) {
      const std::string extra = info.param.extra;
      const size_t zero = extra.find("zero=");
      return fmt::format("{}x{}x{}{}{}", info.param.tp, info.param.pp, info.param.dp,
                         zero != std::string::npos ? "_zero" + extra.substr(zero + 5, 1) : "",
                         extra.find("lax") != std::string::npos    ? "_lax"
                         : extra.find("bf16") != std::string::npos ? "_bf16"
                                                                   : "");
    });

// Under ZeRO each DP rank saves its own slices of Muon's momentum (cut by the buckets), and a
// resume at another ZeRO stage takes its own: the losses go on as the uninterrupted run's.
TEST_F(PipelineCli, MuonResumesAcrossZeroStages) {
  const std::string common =
      "--set optimizer.name=\"muon\" --set parallel.bucket_mb=0.004 --set checkpoint.interval=5 "
      "--set lr_scheduler.decay=constant ";
  const CommandResult a = train(1, 1, 2, "a", common + "--set parallel.zero=1");
  ASSERT_EQ(a.status, 0) << a.output;
  const CommandResult b1 =
      train(1, 1, 2, "b", common + "--set parallel.zero=1 --set training.steps=5");
  ASSERT_EQ(b1.status, 0) << b1.output;
  const CommandResult b2 = train(1, 1, 2, "b", common + "--set parallel.zero=3 --resume");
  ASSERT_EQ(b2.status, 0) << b2.output;
  const auto ma = steps_of(dir / "a/metrics.jsonl"), mb = steps_of(dir / "b/metrics.jsonl");
  ASSERT_EQ(ma.size(), 10u);
  ASSERT_EQ(mb.size(), 10u) << b2.output;
  for (size_t i = 0; i < 10; ++i) {
    const double want = ma[i].at("loss").get<double>(), got = mb[i].at("loss").get<double>();
    EXPECT_NEAR(got, want, 1e-5 * std::fabs(want)) << "step " << i + 1;
  }
}

// Issue 57: where oneDNN has no bf16 matmul (AVX2, e.g. AMD Zen 3; held to it here), the cpu
// backend widens a bf16 GEMM's operands into fp32 scratch as large as the product, and the
// plan holds the largest the step runs on each rank: a projection group's batched GEMM, the
// vocabulary shard's LM head. Two threads a rank, so that the per-thread slabs count twice;
// the GEMM peak's probe of 1024² products leaves no scratch of its own behind.
TEST_F(PipelineCli, WidenedBf16GemmsWithinPlan) {
  for (const std::string model : {"full", "vanilla", "btp"}) {
    const std::string sets = model == "full"
                                 ? "--set model.bottleneck=none --set parallel.tp_mode=full"
                                 : "--set parallel.tp_mode=" + model;
    const CommandResult r =
        train(2, 2, 1, "widened_" + model,
              sets + " --set training.precision=bf16 --set checkpoint.interval=5",
              "OMP_NUM_THREADS=2 DNNL_MAX_CPU_ISA=AVX2 ONEDNN_MAX_CPU_ISA=AVX2");
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_NE(r.output.find("widened to fp32"), std::string::npos) << r.output;
    expect_peaks_within_plan(steps_of(dir / ("widened_" + model + "/metrics.jsonl")),
                             "widened " + model);
  }
}

// Issue 44: gradient buckets reduced during the last backward (parallel.overlap_grad_reduce,
// on by default), and under ZeRO the parameters gathered during the next forward
// (parallel.overlap_param_gather), are the same collectives as after each, so the losses,
// the gradient norms and the checkpoint's bytes are identical with both off: DP alone, DP
// beside TP, each stage's buckets under a pipeline with tied embeddings (the tied table's
// bucket waits for the table's own reduction after the pipeline), four replicas in bf16, and
// ZeRO-1 with each. Buckets of ~1k gradients (parallel.bucket_mb), so that about twenty
// start during backward.
TEST_F(PipelineCli, OverlappedGradientReduceGivesTheSameBits) {
  struct Case {
    int tp, pp, dp;
    std::string extra;
  };
  const std::string common = "--set parallel.bucket_mb=0.004 --set checkpoint.interval=10 ";
  int case_index = 0;
  for (const Case& c :
       {Case{1, 1, 2, ""}, Case{2, 1, 2, "--set parallel.tp_mode=btp"},
        Case{1, 2, 2, "--set model.tie_embeddings=true"},
        Case{1, 1, 4, "--set training.precision=bf16"},
        // ZeRO-1: the buckets reduce-scattered, the tied table's after the pipeline.
        Case{1, 2, 2, "--set parallel.zero=1 --set model.tie_embeddings=true"},
        Case{1, 1, 4, "--set parallel.zero=1 --set training.precision=bf16"},
        // ZeRO-2: every micro-batch's buckets reduce-scattered as each block's backward ends
        // and added to the shard in the order issued, the tied table's after the pipeline.
        Case{1, 2, 2, "--set parallel.zero=2 --set model.tie_embeddings=true"},
        Case{2, 1, 2, "--set parallel.zero=2 --set parallel.tp_mode=btp"},
        Case{1, 1, 4, "--set parallel.zero=2 --set training.precision=bf16"},
        // ZeRO-3: each unit's parameters gathered before its forward and its backward, the
        // next one's started ahead, the tied table's kept whole for the step.
        Case{1, 2, 2, "--set parallel.zero=3 --set model.tie_embeddings=true"},
        Case{2, 1, 2, "--set parallel.zero=3 --set parallel.tp_mode=btp"},
        Case{1, 1, 4,
             "--set parallel.zero=3 --set training.precision=bf16 --set "
             "training.recompute=block"}}) {
    // A folder of its own per case: two cases may share a layout.
    const std::string name = fmt::format("{}x{}x{}_{}", c.tp, c.pp, c.dp, case_index++);
    SCOPED_TRACE(name + " " + c.extra);
    const CommandResult on = train(c.tp, c.pp, c.dp, name + "_on", common + c.extra);
    ASSERT_EQ(on.status, 0) << on.output;
    const CommandResult off = train(c.tp, c.pp, c.dp, name + "_off",
                                    common +
                                        "--set parallel.overlap_grad_reduce=false --set "
                                        "parallel.overlap_param_gather=false " +
                                        c.extra);
    ASSERT_EQ(off.status, 0) << off.output;
    const bool zero2 =
        c.extra.find("zero=2") != std::string::npos || c.extra.find("zero=3") != std::string::npos;
    const bool zero3 = c.extra.find("zero=3") != std::string::npos;
    EXPECT_NE(on.output.find(zero2 ? " during every backward (parallel.overlap_grad_reduce = true)"
                                   : " during backward (parallel.overlap_grad_reduce = true)"),
              std::string::npos)
        << on.output;
    EXPECT_NE(off.output.find(zero2 ? " after every block (parallel.overlap_grad_reduce = false)"
                                    : " after backward (parallel.overlap_grad_reduce = false)"),
              std::string::npos)
        << off.output;
    if (zero3) {
      EXPECT_NE(on.output.find("(ZeRO-3, parallel.overlap_param_gather = true)"), std::string::npos)
          << on.output;
      EXPECT_NE(off.output.find("(ZeRO-3, parallel.overlap_param_gather = false)"),
                std::string::npos)
          << off.output;
    } else if (c.extra.find("zero") != std::string::npos) {
      EXPECT_NE(on.output.find("parameters all-gathered during the next forward"),
                std::string::npos)
          << on.output;
      EXPECT_NE(off.output.find("parameters all-gathered after the update"), std::string::npos)
          << off.output;
    }
    const auto a = steps_of(dir / (name + "_on/metrics.jsonl"));
    const auto b = steps_of(dir / (name + "_off/metrics.jsonl"));
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].at("loss").dump(), b[i].at("loss").dump()) << "step " << i + 1;
      EXPECT_EQ(a[i].at("grad_norm").dump(), b[i].at("grad_norm").dump()) << "step " << i + 1;
    }
    expect_same_tensors(dir / (name + "_off/step_00000010"), dir / (name + "_on/step_00000010"));
  }
}

// Trains at ZeRO stage `zero` and replicated (ZeRO-0) on `dp` ranks with `more` settings:
// the losses and every checkpoint file (weights, and moments gathered from the slices) the
// same, and each checkpoint resumed at the other stage goes on in the same bits.
void expect_replicated_bits(PipelineCli& t, int dp, int zero, const std::string& more,
                            const std::string& expected_line) {
  const std::string common =
      "--set training.max_norm=0 --set parallel.bucket_mb=0.004 --set "
      "checkpoint.interval=5 " +
      more + " ";
  const std::string sharding = fmt::format("--set parallel.zero={} ", zero);
  const std::string zn = fmt::format("z{}", zero);
  const CommandResult sharded = t.train(1, 1, dp, zn, common + sharding);
  ASSERT_EQ(sharded.status, 0) << sharded.output;
  EXPECT_NE(sharded.output.find(expected_line), std::string::npos) << sharded.output;
  const CommandResult replicated = t.train(1, 1, dp, "z0", common);
  ASSERT_EQ(replicated.status, 0) << replicated.output;
  const auto a = steps_of(t.dir / (zn + "/metrics.jsonl")),
             b = steps_of(t.dir / "z0/metrics.jsonl");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_EQ(a[i].at("loss").dump(), b[i].at("loss").dump()) << "step " << i + 1;
  for (const char* step : {"step_00000005", "step_00000010"})
    expect_same_tensors(t.dir / (zn + "/" + step), t.dir / (std::string("z0/") + step));
  for (const auto& [from, folder, sets] :
       {std::tuple{zn, zn + "_as_z0", common},
        std::tuple{std::string("z0"), "z0_as_" + zn, common + sharding}}) {
    SCOPED_TRACE(folder);
    fs::copy(t.dir / from, t.dir / folder, fs::copy_options::recursive);
    fs::remove_all(t.dir / (folder + "/step_00000010"));
    const CommandResult resumed = t.train(1, 1, dp, folder, sets + " --resume");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    expect_same_tensors(t.dir / (folder + "/step_00000010"), t.dir / "z0/step_00000010");
  }
}

// Issue 44: ZeRO-1's slices of many buckets, each reduce-scattered during backward, against
// replicated AdamW at the same dp. Without clipping (whose factor reads the norm, summed in
// another order under ZeRO) the two make the same element-wise arithmetic, so the losses and
// every checkpoint file are identical; a ZeRO-1 checkpoint resumed at ZeRO-0, and a ZeRO-0
// one at ZeRO-1, go on in the same bits.
// Issue 44: TP overlap (parallel.tp_overlap) beside data and pipeline parallelism, where the
// halves meet the DP hook, ZeRO's gathers and the stage boundary: the first step's loss is the
// serial one bit for bit (a half's activations are the serial rows), and the ten steps stay
// within fp32 rounding of it (the gradients are summed half by half).
TEST_F(PipelineCli, TpOverlapBesideDataAndPipelineTrainsAsSerial) {
  struct Case {
    int tp, pp, dp;
    std::string extra;
  };
  int case_index = 0;
  for (const Case& c :
       {Case{2, 1, 2, "--set parallel.zero=2"}, Case{2, 1, 2, "--set parallel.zero=3"},
        Case{2, 2, 1, "--set parallel.tp_mode=vanilla"}}) {
    const std::string name = fmt::format("overlap_{}x{}x{}_{}", c.tp, c.pp, c.dp, case_index++);
    SCOPED_TRACE(name + " " + c.extra);
    const CommandResult on =
        train(c.tp, c.pp, c.dp, name + "_on", "--set parallel.tp_overlap=true " + c.extra);
    ASSERT_EQ(on.status, 0) << on.output;
    const CommandResult off = train(c.tp, c.pp, c.dp, name + "_off", c.extra);
    ASSERT_EQ(off.status, 0) << off.output;
    const auto a = steps_of(dir / (name + "_on/metrics.jsonl"));
    const auto b = steps_of(dir / (name + "_off/metrics.jsonl"));
    ASSERT_EQ(a.size(), 10u);
    ASSERT_EQ(b.size(), 10u);
    EXPECT_EQ(a[0].at("loss").dump(), b[0].at("loss").dump());
    for (size_t i = 0; i < a.size(); ++i) {
      const double x = a[i].at("loss").get<double>(), y = b[i].at("loss").get<double>();
      EXPECT_LE(std::abs(x - y), 1e-5 * std::abs(y)) << "step " << i + 1;
    }
  }
}

TEST_F(PipelineCli, ZeroSlicesGiveReplicatedBitsAndResumeEitherWay) {
  expect_replicated_bits(*this, 2, 1, "", "reduce-scattered during backward");
}

// Issue 44: ZeRO-2 with one micro-batch per step: each block's buckets reduce-scattered as
// its backward ends, out of the two gradient slots, into the gradient shard: the sums
// ZeRO-1's are, so the same bits as replicated AdamW, a checkpoint resumed at ZeRO-0 and the
// reverse included. (With more micro-batches each is summed over the ranks first: another
// rounding, which TenStepsMatchOneProcess bounds.)
TEST_F(PipelineCli, ZeroTwoAtOneMicroBatchGivesReplicatedBitsAndResumesEitherWay) {
  expect_replicated_bits(*this, 2, 2, "--set training.grad_accum_steps=1",
                         "reduce-scattered during every backward");
}

// Issue 44: ZeRO-3 with one micro-batch per step: each rank keeps its slices of the fp32
// masters, and every block's are gathered before its forward and again before its backward;
// the sums are ZeRO-2's and the gathered values the masters themselves, so the same bits as
// replicated AdamW, a ZeRO-3 checkpoint resumed at ZeRO-0 and the reverse included.
TEST_F(PipelineCli, ZeroThreeAtOneMicroBatchGivesReplicatedBitsAndResumesEitherWay) {
  expect_replicated_bits(*this, 2, 3, "--set training.grad_accum_steps=1",
                         "parameters kept as 1/2 shards and gathered per unit");
}

// The same in bf16 with block recomputation (the gathered fp32 units cast to bf16 on each rank,
// as AdamW casts them under ZeRO-0; the recomputed forward reads the unit its backward gathered)
// and tied embeddings (the table's unit kept whole for the step).
TEST_F(PipelineCli, ZeroThreeInBf16WithRecomputationGivesReplicatedBits) {
  expect_replicated_bits(*this, 2, 3,
                         "--set training.grad_accum_steps=1 --set training.precision=bf16 --set "
                         "training.recompute=block --set model.tie_embeddings=true",
                         "parameters kept as 1/2 shards and gathered per unit");
}

// Validation under ZeRO-3 gathers each unit for its forward as training does (and the next
// step finds the slots as the evaluation left them): the validation losses are ZeRO-0's.
TEST_F(PipelineCli, ZeroThreeEvaluatesAsReplicated) {
  const std::string common = fmt::format(
      "--set training.grad_accum_steps=1 --set training.max_norm=0 --set "
      "training.eval_interval=3 --set training.eval_batches=2 --set data.val={} ",
      dir / "train.bin");
  std::map<int, std::vector<std::string>> val;
  for (int zero : {0, 3}) {
    const std::string folder = fmt::format("val_z{}", zero);
    const CommandResult r =
        train(1, 1, 2, folder, common + fmt::format("--set parallel.zero={}", zero));
    ASSERT_EQ(r.status, 0) << r.output;
    std::ifstream in(dir / (folder + "/metrics.jsonl"));
    for (std::string line; std::getline(in, line);) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_object() && j.contains("val_loss")) val[zero].push_back(j.at("val_loss").dump());
    }
  }
  ASSERT_EQ(val[0].size(), 4u);  // steps 3, 6, 9 and the last
  EXPECT_EQ(val[3], val[0]);
}

// ZeRO-3 reduces the gradients as ZeRO-2 does (each micro-batch's reduce-scattered, added to
// the shard in the order issued), so with several micro-batches per step, over a pipeline with
// tied embeddings, the two give the same bits: losses and checkpoints.
TEST_F(PipelineCli, ZeroThreeGivesZeroTwosBitsOverMicroBatches) {
  const std::string common =
      "--set training.grad_accum_steps=4 --set model.tie_embeddings=true --set "
      "parallel.bucket_mb=0.004 --set checkpoint.interval=10 ";
  for (int zero : {2, 3}) {
    const CommandResult r = train(1, 2, 2, fmt::format("acc_z{}", zero),
                                  common + fmt::format("--set parallel.zero={}", zero));
    ASSERT_EQ(r.status, 0) << r.output;
  }
  const auto a = steps_of(dir / "acc_z2/metrics.jsonl"), b = steps_of(dir / "acc_z3/metrics.jsonl");
  ASSERT_EQ(a.size(), 10u);
  ASSERT_EQ(b.size(), 10u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].at("loss").dump(), b[i].at("loss").dump()) << "step " << i + 1;
    EXPECT_EQ(a[i].at("grad_norm").dump(), b[i].at("grad_norm").dump()) << "step " << i + 1;
  }
  expect_same_tensors(dir / "acc_z3/step_00000010", dir / "acc_z2/step_00000010");
}

// Trains 8 full-rank blocks (d 64) on 4 DP ranks at ZeRO stage `zero`, in `folder`: the peak of
// each memory tag of `tags` as the last metrics line gives it, the same on every rank, and the
// plan's figure (the run's first line) equal to it.
std::map<std::string, int64_t> memory_peaks(PipelineCli& t, int zero, const std::string& folder,
                                            std::initializer_list<const char*> tags) {
  const std::string model =
      "--set model.bottleneck=none --set model.num_layers=8 --set model.hidden_size=64 --set "
      "model.intermediate_size=176 --set training.steps=2 --set training.grad_accum_steps=1 ";
  std::map<std::string, int64_t> peak;
  const CommandResult r =
      t.train(1, 1, 4, folder, model + fmt::format("--set parallel.zero={}", zero));
  EXPECT_EQ(r.status, 0) << r.output;
  const auto rows = steps_of(t.dir / (folder + "/metrics.jsonl"));
  EXPECT_FALSE(rows.empty()) << r.output;
  if (rows.empty()) return peak;
  for (const char* tag : tags) {
    const auto& ranks = rows.back().at("memory").at(tag);
    peak[tag] = ranks.at(0).get<int64_t>();
    for (const auto& rank : ranks) EXPECT_EQ(rank.get<int64_t>(), peak[tag]) << tag;
    EXPECT_NE(r.output.find(fmt::format("{} {},", tag, format_bytes(size_t(peak[tag])))),
              std::string::npos)
        << tag << ": " << r.output;
  }
  return peak;
}

// A block of memory_peaks' model: 4·64² + 3·64·176 fp32 values.
constexpr int64_t kPeaksBlockBytes = (4 * 64 * 64 + 3 * 64 * 176) * 4;

// Issue 44: ZeRO-3 keeps 1/dp of the parameters, gradients and optimizer state plus two units'
// slots: the peaks measured on each rank (metrics.jsonl) against ZeRO-0's, and the plan (the
// run's first line) equal to the measured peaks.
TEST_F(PipelineCli, ZeroThreeKeepsAShardOfEverything) {
  std::map<int, std::map<std::string, int64_t>> peak;
  for (int zero : {0, 3})
    peak[zero] = memory_peaks(*this, zero, fmt::format("mem3_z{}", zero),
                              {"weights", "gradients", "optimizer"});
  auto state = [&](int zero) {
    return peak[zero]["weights"] + peak[zero]["gradients"] + peak[zero]["optimizer"];
  };
  // A block's weights and its gradients in a slot each.
  const int64_t block = kPeaksBlockBytes;
  std::printf(
      "weights + gradients + optimizer per rank at dp 4: ZeRO-0 %lld B, ZeRO-3 %lld B "
      "(weights %lld B; a block: %lld B)\n",
      static_cast<long long>(state(0)), static_cast<long long>(state(3)),
      static_cast<long long>(peak[3]["weights"]), static_cast<long long>(block));
  EXPECT_LE(state(3), state(0) / 4 + 2 * 2 * block + 16384);
  EXPECT_LE(peak[3]["weights"], peak[0]["weights"] / 4 + 2 * block + 8192);
}

// Issue 44: ZeRO-2 keeps 1/dp of the gradients plus two blocks' slots: the peak of the
// gradients' memory measured on each rank (metrics.jsonl) against ZeRO-0's, and the plan
// (the run's first line) equal to the measured peak.
TEST_F(PipelineCli, ZeroTwoKeepsAShardOfTheGradients) {
  std::map<int, int64_t> peak;
  for (int zero : {0, 2})
    peak[zero] =
        memory_peaks(*this, zero, fmt::format("mem_z{}", zero), {"gradients"})["gradients"];
  const int64_t block = kPeaksBlockBytes;
  std::printf("gradients per rank at dp 4: ZeRO-0 %lld B, ZeRO-2 %lld B (a block: %lld B)\n",
              static_cast<long long>(peak[0]), static_cast<long long>(peak[2]),
              static_cast<long long>(block));
  EXPECT_LE(peak[2], peak[0] / 4 + 2 * block + 4096);
  EXPECT_LT(peak[2], peak[0] * 3 / 4);
}

// A 2x2x1 checkpoint resumed as 1x1x1 and as 1x2x2: the next step's loss is that of the
// 2x2x1 run going on uninterrupted.
TEST_F(PipelineCli, ResumeOnAnotherLayout) {
  // The uninterrupted run also checkpoints at step 5 (the LR schedule depends on the total
  // steps, so the interrupted runs are this run with its last checkpoint taken away).
  const CommandResult whole =
      train(2, 2, 1, "whole", "--set training.steps=6 --set checkpoint.interval=5");
  ASSERT_EQ(whole.status, 0) << whole.output;
  const double want = steps_of(dir / "whole/metrics.jsonl").back().at("loss").get<double>();
  ASSERT_TRUE(fs::exists(dir / "whole/step_00000005/checkpoint_index.json")) << whole.output;
  for (const std::string folder : {"a", "b"}) {
    fs::copy(dir / "whole", dir / folder, fs::copy_options::recursive);
    fs::remove_all(dir / (folder + "/step_00000006"));
  }
  for (const auto& [folder, layout] : std::vector<std::pair<std::string, std::array<int, 3>>>{
           {"a", {1, 1, 1}}, {"b", {1, 2, 2}}}) {
    const CommandResult resumed =
        train(layout[0], layout[1], layout[2], folder,
              "--set training.steps=6 --set checkpoint.interval=5 --resume");
    ASSERT_EQ(resumed.status, 0) << resumed.output;
    const auto rows = steps_of(dir / (folder + "/metrics.jsonl"));
    EXPECT_EQ(rows.back().at("step").get<int>(), 6);
    EXPECT_NEAR(rows.back().at("loss").get<double>(), want, 1e-5) << folder;
    std::printf("resumed as %dx%dx%d: step 6 loss %.7f, uninterrupted 2x2x1 %.7f\n", layout[0],
                layout[1], layout[2], rows.back().at("loss").get<double>(), want);
  }
  // The sharded checkpoint exports to the one HF model, which evaluates to the same loss.
  const CommandResult exported =
      run(fmt::format("{} export --checkpoint {} --out {}", bottle_binary(),
                      dir / "whole/step_00000005", dir / "exported"));
  ASSERT_EQ(exported.status, 0) << exported.output;
  EXPECT_TRUE(fs::exists(dir / "exported/model.safetensors"));
  const std::string eval = fmt::format("{} eval --data {} --batch 2 --seq 16 --batches 4 --json",
                                       bottle_binary(), dir / "train.bin");
  const CommandResult x = run(eval + " --checkpoint " + dir / "exported");
  const CommandResult y = run(eval + " --checkpoint " + dir / "whole/step_00000005");
  ASSERT_EQ(x.status, 0) << x.output;
  ASSERT_EQ(y.status, 0) << y.output;
  EXPECT_EQ(x.output, y.output);
}

// Issue 59: a schedule splitting each backward into B and W (zb_h1) runs the same GEMMs on the
// same inputs as 1F1B, each weight's micro-batches in the same order: the same losses and
// gradient norms bit for bit, and the same checkpoint, at every layout it runs on (TP 2 in each
// mode, 4 stages, DP 2 with ZeRO-1, bf16, LaX's latents crossing a stage boundary).
struct ScheduleCase {
  int tp, pp, dp;
  const char* extra;
};

class SplitBackward : public PipelineCli, public ::testing::WithParamInterface<ScheduleCase> {};

TEST_P(SplitBackward, ZbH1GivesOneFOneBsBits) {
  const ScheduleCase c = GetParam();
  const std::string base =
      "--set training.steps=4 --set checkpoint.interval=4 " + std::string(c.extra);
  std::map<std::string, std::vector<nlohmann::json>> rows;
  for (const std::string schedule : {"1f1b", "zb_h1"}) {
    const CommandResult r =
        train(c.tp, c.pp, c.dp, schedule, base + " --set parallel.schedule=" + schedule);
    ASSERT_EQ(r.status, 0) << r.output;
    rows[schedule] = steps_of(dir / (schedule + "/metrics.jsonl"));
    ASSERT_EQ(rows[schedule].size(), 4u) << r.output;
  }
  for (size_t i = 0; i < 4; ++i)
    for (const char* key : {"loss", "grad_norm"})
      EXPECT_EQ(rows["zb_h1"][i].at(key).get<double>(), rows["1f1b"][i].at(key).get<double>())
          << key << " at step " << i + 1;
  expect_same_tensors(dir / "1f1b/step_00000004", dir / "zb_h1/step_00000004");
  expect_peaks_within_plan(rows["zb_h1"], "zb_h1 " + std::string(c.extra));
}

INSTANTIATE_TEST_SUITE_P(
    Tp_Pp_Dp, SplitBackward,
    ::testing::Values(
        ScheduleCase{1, 2, 1, ""}, ScheduleCase{1, 4, 1, ""},
        ScheduleCase{2, 2, 1, "--set parallel.tp_mode=btp"},
        ScheduleCase{2, 2, 1, "--set parallel.tp_mode=vanilla --set model.bottleneck=lax"},
        ScheduleCase{2, 2, 1, "--set model.bottleneck=none --set parallel.tp_mode=full"},
        ScheduleCase{1, 2, 2, "--set parallel.zero=1"},
        ScheduleCase{1, 2, 1, "--set training.precision=bf16 --set model.tie_embeddings=true"}),
    [](const auto& info) {
      const ScheduleCase& c = info.param;
      std::string name = fmt::format("{}x{}x{}_{}", c.tp, c.pp, c.dp, info.index);
      return name;
    });

// A checkpoint of one schedule resumes under another: the step after it is the uninterrupted
// run's, bit for bit; what a split backward cannot run beside is refused at load, naming it.
TEST_F(PipelineCli, ResumesAcrossSchedulesAndRefusesWhatZbH1CannotRun) {
  const CommandResult whole =
      train(1, 2, 1, "whole", "--set training.steps=4 --set checkpoint.interval=2");
  ASSERT_EQ(whole.status, 0) << whole.output;
  fs::copy(dir / "whole", dir / "resumed", fs::copy_options::recursive);
  fs::remove_all(dir / "resumed/step_00000004");
  const CommandResult resumed = train(
      1, 2, 1, "resumed",
      "--set training.steps=4 --set checkpoint.interval=2 --set parallel.schedule=zb_h1 --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  const auto a = steps_of(dir / "whole/metrics.jsonl"), b = steps_of(dir / "resumed/metrics.jsonl");
  ASSERT_EQ(b.back().at("step").get<int>(), 4);
  EXPECT_EQ(b.back().at("loss").get<double>(), a.back().at("loss").get<double>());
  expect_same_tensors(dir / "whole/step_00000004", dir / "resumed/step_00000004");
  for (const auto& [sets, named] : std::vector<std::pair<std::string, std::string>>{
           {"--set training.recompute=block", "training.recompute"},
           {"--set parallel.dp=2 --set parallel.zero=2", "parallel.zero"},
           {"--set parallel.pp=1", "parallel.pp >= 2"}}) {
    const CommandResult refused =
        run(fmt::format("{} {} train {} --set parallel.pp=2 --set parallel.schedule=zb_h1 {} "
                        "--set checkpoint.folder={}",
                        mpirun(1), bottle_binary(), dir / "tiny.toml", sets, dir / "refused"));
    EXPECT_NE(refused.status, 0) << sets;
    EXPECT_NE(refused.output.find("zb_h1"), std::string::npos) << refused.output;
    EXPECT_NE(refused.output.find(named), std::string::npos) << refused.output;
  }
}

// 8 micro-batches on 4 stages: stage 0 keeps 4 micro-batches of activations alive under
// 1F1B and 8 under GPipe.
TEST_F(PipelineCli, OneFOneBKeepsFewerMicroBatchesAlive) {
  std::map<std::string, double> bytes;
  for (const std::string schedule : {"1f1b", "gpipe"}) {
    const CommandResult r = run(
        fmt::format("{} {} train {} --set parallel.pp=4 --set parallel.schedule={} --set "
                    "training.grad_accum_steps=8 --set training.steps=2 --set checkpoint.folder={}",
                    mpirun(4), bottle_binary(), dir / "tiny.toml", schedule, dir / schedule));
    ASSERT_EQ(r.status, 0) << r.output;
    bytes[schedule] = steps_of(dir / (schedule + "/metrics.jsonl")).back().at("activation_bytes");
  }
  const double ratio = bytes["gpipe"] / bytes["1f1b"];
  std::printf("stage 0 peak activation bytes: gpipe %.0f, 1f1b %.0f, ratio %.2f\n", bytes["gpipe"],
              bytes["1f1b"], ratio);
  // Per-micro-batch buffers dominate: close to 8 / 4 (shared gradient scratch aside).
  EXPECT_GT(ratio, 1.6);
  EXPECT_LT(ratio, 2.0);
}

// A rank killed mid-step ends the whole job, non-zero, within 30 s, naming the rank.
TEST_F(PipelineCli, KilledRankEndsTheJob) {
  const auto start = std::chrono::steady_clock::now();
  const CommandResult r = run(fmt::format(
      "BOTTLE_FAILPOINT=kill_rank:1:3 {} {} train {} --set parallel.pp=2 --set parallel.dp=2 "
      "--set training.grad_accum_steps=2 --set checkpoint.folder={}",
      mpirun(4), bottle_binary(), dir / "tiny.toml", dir / "killed"));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job hung:\n" << r.output;
  EXPECT_LT(seconds, 30.0) << r.output;
  EXPECT_NE(r.output.find("rank 1"), std::string::npos) << r.output;
}

// bench pipeline: each schedule's bubble next to the ideal, and the DP gradient traffic of
// the full-rank model against the bottleneck model's.
TEST_F(PipelineCli, BenchPipelineReportsBubbleAndTraffic) {
  const CommandResult r = run(fmt::format(
      "{} {} bench pipeline {} --set parallel.pp=2 --set parallel.dp=2 --steps 1 --warmup 0",
      mpirun(4), bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(r.status, 0) << r.output;
  // 1f1b, gpipe and zb_h1 for each model.
  EXPECT_EQ(count_occurrences(r.output, "bubble"), 6) << r.output;
  // 2 stages, 4 micro-batches: (2 - 1) / (4 + 2 - 1); ZB-H1 (2 - 1) / (3·4 + 2 - 1).
  EXPECT_NE(r.output.find("(ideal  20.0%;"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("zb_h1 step"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(ideal   7.7%;"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("micro-batches in flight"), std::string::npos) << r.output;
  // The theory at the passes' measured costs, and zb_h1's B and W apart.
  EXPECT_NE(r.output.find("at the passes' measured ms per micro-batch, stage 0: F "),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find(" W "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("DP gradient traffic, full-rank / cola:"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace bottle::testing
