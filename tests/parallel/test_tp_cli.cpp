// The bottle binary under mpirun with tensor parallelism: a bad layout ends in one clear
// error on every rank (never a hang), checkpoints written by a TP run load into any layout,
// and `bench tp` prints the per-block volumes of docs/design.md §4.
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "test_util.h"

namespace bottle::testing {
namespace {

class TpCli : public ::testing::Test {
 protected:
  void SetUp() override {
    write_random_shard(dir / "train.bin", 20000, 64, 1);
    write_random_shard(dir / "val.bin", 4000, 64, 2);
    std::ofstream(dir / "tiny.toml")
        << kTinyColaModelToml
        << fmt::format(R"([training]
steps = 4
micro_batch_size = 2
seq_len = 16
eval_interval = 0

[data]
train = "{}"
val = "{}"

[checkpoint]
folder = "{}"
interval = 0

[metrics]
log_freq = 1
)",
                       dir / "train.bin", dir / "val.bin", dir / "run");
  }
  CommandResult train(int ranks, const std::string& sets) {
    return run(
        fmt::format("{} {} train {} {}", mpirun(ranks), bottle_binary(), dir / "tiny.toml", sets));
  }
  TempDir dir;
};

struct BadLayout {
  const char* name;
  int ranks;
  const char* sets;
  const char* message;
};

class TpBadLayout : public TpCli, public ::testing::WithParamInterface<BadLayout> {};

TEST_P(TpBadLayout, OneClearErrorOnEveryRank) {
  const BadLayout b = GetParam();
  const CommandResult r = train(b.ranks, b.sets);
  EXPECT_NE(r.status, 0) << r.output;
  EXPECT_NE(r.status, 124) << "the job hung:\n" << r.output;
  EXPECT_EQ(count_occurrences(r.output, "bottle: error: "), b.ranks) << r.output;
  EXPECT_EQ(count_occurrences(r.output, b.message), b.ranks) << r.output;
  EXPECT_EQ(count_occurrences(r.output, "step 1"), 0) << "work started:\n" << r.output;
}

INSTANTIATE_TEST_SUITE_P(
    Cases, TpBadLayout,
    ::testing::Values(
        BadLayout{"heads", 2,
                  "--set parallel.tp=2 --set model.num_heads=1 --set model.num_kv_heads=1",
                  "must divide model.num_heads (1)"},
        BadLayout{"kv_heads", 2, "--set parallel.tp=2 --set model.num_kv_heads=1",
                  "must divide model.num_kv_heads (1)"},
        BadLayout{"hidden", 4,
                  "--set parallel.tp=4 --set model.hidden_size=34 --set model.num_heads=1 "
                  "--set model.num_kv_heads=1",
                  "must divide model.hidden_size (34)"},
        BadLayout{"ffn", 2, "--set parallel.tp=2 --set model.intermediate_size=49",
                  "must divide model.intermediate_size (49)"},
        BadLayout{"vocab", 2, "--set parallel.tp=2 --set model.vocab_size=63",
                  "must divide model.vocab_size (63)"},
        BadLayout{"rank_vanilla", 2,
                  "--set parallel.tp=2 --set parallel.tp_mode=vanilla --set model.rank=9",
                  "must divide the rank of the q projection (9)"},
        // parallel.dp set: unset, it is inferred from the world size (issue 29).
        BadLayout{"world_too_big", 2, "--set parallel.dp=1", "world size 2 does not equal"},
        BadLayout{"world_too_small", 2, "--set parallel.tp=4", "world size 2 does not equal"},
        BadLayout{"btp_on_full_rank", 2,
                  "--set parallel.tp=2 --set model.bottleneck=none --set parallel.tp_mode=btp",
                  "which needs a bottleneck model"},
        BadLayout{"vanilla_on_full_rank", 2,
                  "--set parallel.tp=2 --set model.bottleneck=none --set parallel.tp_mode=vanilla",
                  "which needs a bottleneck model"},
        BadLayout{"full_on_cola", 2, "--set parallel.tp=2 --set parallel.tp_mode=full",
                  "which is for a full-rank model"},
        BadLayout{"memory_limit", 2, "--set parallel.tp=2 --set training.memory_limit=100KiB",
                  "training.memory_limit is 100.0 KiB (102400 bytes), but this layout needs an "
                  "estimated"},
        BadLayout{"lowrank_under_vanilla", 2,
                  "--set parallel.tp=2 --set parallel.tp_mode=vanilla --set "
                  "training.recompute=lowrank",
                  "key 'training.recompute' = \"lowrank\" needs parallel.tp_mode = \"btp\""}),
    [](const auto& info) { return std::string(info.param.name); });

double json_loss(const CommandResult& r) {
  const size_t brace = r.output.rfind('{');
  EXPECT_NE(brace, std::string::npos) << r.output;
  if (brace == std::string::npos) return 0;
  return nlohmann::json::parse(r.output.substr(brace)).at("loss").get<double>();
}

// A checkpoint written by a TP=2 btp run is the one HF model: it evaluates to the same
// loss in every layout, and --init-from loads it into any layout.
TEST_F(TpCli, CheckpointsLoadIntoAnyLayout) {
  const CommandResult trained = train(2, "--set parallel.tp=2 --set parallel.tp_mode=btp");
  ASSERT_EQ(trained.status, 0) << trained.output;
  EXPECT_EQ(count_occurrences(trained.output, "done: 4 steps"), 1)
      << trained.output;  // rank 0 reports
  const std::string ckpt = dir / "run/step_00000004";
  // Each TP rank wrote its own slices, listed by the checkpoint's index (a sharded checkpoint).
  ASSERT_TRUE(fs::exists(ckpt + "/rank-00000.safetensors")) << trained.output;
  ASSERT_TRUE(fs::exists(ckpt + "/rank-00001.safetensors")) << trained.output;
  ASSERT_TRUE(fs::exists(ckpt + "/checkpoint_index.json")) << trained.output;
  // The same 4 steps on one rank give the same weights (and so the same eval loss).
  const CommandResult serial = train(1, fmt::format("--set checkpoint.folder={}", dir / "serial"));
  ASSERT_EQ(serial.status, 0) << serial.output;
  const std::string eval =
      fmt::format("eval --data {} --batch 2 --seq 16 --batches 8 --json", dir / "val.bin");
  const double one = json_loss(run(
      fmt::format("{} {} --checkpoint {}", bottle_binary(), eval, dir / "serial/step_00000004")));
  for (const auto& [ranks, mode] : std::vector<std::pair<int, std::string>>{
           {1, "btp"}, {2, "btp"}, {2, "vanilla"}, {4, "btp"}, {4, "vanilla"}}) {
    const CommandResult r =
        run(fmt::format("{} {} {} --checkpoint {} --set parallel.tp={} --set parallel.tp_mode={}",
                        mpirun(ranks), bottle_binary(), eval, ckpt, ranks, mode));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(count_occurrences(r.output, "\"loss\""), 1) << "one report, from rank 0:\n"
                                                          << r.output;
    EXPECT_NEAR(json_loss(r), one, 1e-5 * one) << ranks << " ranks, " << mode;
  }
  // --init-from into TP=4 vanilla and into one rank: the same first loss.
  auto first_loss = [&](const std::string& folder) {
    std::ifstream in(dir / (folder + "/metrics.jsonl"));
    std::string line;
    std::getline(in, line);
    return nlohmann::json::parse(line).at("loss").get<double>();
  };
  const CommandResult a =
      run(fmt::format("{} {} train {} --init-from {} --set checkpoint.folder={} --set "
                      "parallel.tp=4 --set parallel.tp_mode=vanilla",
                      mpirun(4), bottle_binary(), dir / "tiny.toml", ckpt, dir / "from4"));
  ASSERT_EQ(a.status, 0) << a.output;
  const CommandResult b = run(fmt::format("{} train {} --init-from {} --set checkpoint.folder={}",
                                          bottle_binary(), dir / "tiny.toml", ckpt, dir / "from1"));
  ASSERT_EQ(b.status, 0) << b.output;
  EXPECT_NEAR(first_loss("from4"), first_loss("from1"), 1e-5);
  // --resume under TP=2 continues from the TP=2 checkpoint.
  const CommandResult resumed =
      train(2, "--set parallel.tp=2 --set parallel.tp_mode=btp --set training.steps=6 --resume");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(fs::exists(dir / "run/step_00000006/checkpoint_index.json")) << resumed.output;
}

std::vector<nlohmann::json> metrics_of(const std::string& path) {
  std::vector<nlohmann::json> rows;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) rows.push_back(nlohmann::json::parse(line));
  return rows;
}

using PolicyRuns = std::map<std::string, std::vector<nlohmann::json>>;

// Every step's line says what each group's collectives took ("comm": calls, bytes, seconds,
// exposed seconds), for exactly the groups of more than one rank; each step of a run makes
// the same calls.
void expect_comm_per_step(const std::vector<nlohmann::json>& rows,
                          const std::set<std::string>& groups) {
  ASSERT_FALSE(rows.empty());
  for (const nlohmann::json& row : rows) {
    const nlohmann::json& comm = row.at("comm");
    std::set<std::string> seen;
    for (const auto& [name, group] : comm.items()) {
      seen.insert(name);
      EXPECT_GT(group.at("calls").get<int64_t>(), 0) << name;
      EXPECT_GT(group.at("bytes").get<int64_t>(), 0) << name;
      EXPECT_GT(group.at("s").get<double>(), 0.0) << name;
      EXPECT_GE(group.at("exposed_s").get<double>(), 0.0) << name;
      EXPECT_EQ(group.at("calls"), rows.front().at("comm").at(name).at("calls")) << name;
      EXPECT_EQ(group.at("bytes"), rows.front().at("comm").at(name).at("bytes")) << name;
    }
    EXPECT_EQ(seen, groups) << row.dump();
  }
}

// block and lowrank logged the very losses and gradient norms of none, step by step.
void expect_same_steps(PolicyRuns& runs) {
  for (const std::string policy : {"block", "lowrank"}) {
    ASSERT_EQ(runs[policy].size(), runs["none"].size()) << policy;
    for (size_t i = 0; i < runs["none"].size(); ++i) {
      EXPECT_EQ(runs[policy][i].at("loss").dump(), runs["none"][i].at("loss").dump()) << policy;
      EXPECT_EQ(runs[policy][i].at("grad_norm").dump(), runs["none"][i].at("grad_norm").dump());
    }
  }
}

// Recomputation changes where memory goes, never the numbers: the same losses and gradient
// norms to the last bit, with less activation memory, reported per tag and rank.
TEST_F(TpCli, RecomputeTrainsTheSameStepsWithLessMemory) {
  PolicyRuns runs;
  for (const std::string policy : {"none", "block", "lowrank"}) {
    const CommandResult r = train(2, fmt::format("--set parallel.tp=2 --set training.recompute={} "
                                                 "--set checkpoint.folder={}",
                                                 policy, dir / policy));
    ASSERT_EQ(r.status, 0) << r.output;
    EXPECT_EQ(count_occurrences(r.output, fmt::format("recompute \"{}\"", policy)), 1) << r.output;
    runs[policy] = metrics_of(dir / (policy + "/metrics.jsonl"));
    ASSERT_EQ(runs[policy].size(), 4u);
    expect_comm_per_step(runs[policy], {"tp"});
  }
  expect_same_steps(runs);
  auto activations = [&](const std::string& policy, size_t rank) {
    const nlohmann::json& memory = runs[policy].back().at("memory");
    EXPECT_EQ(memory.at("weights").size(), 2u) << "one entry per rank";
    for (const char* tag :
         {"weights", "gradients", "optimizer", "activations", "comm", "workspace", "total"})
      EXPECT_GT(memory.at(tag).at(rank).get<uint64_t>(), 0u) << tag;
    return memory.at("activations").at(rank).get<uint64_t>();
  };
  for (size_t rank : {0, 1}) {
    EXPECT_LT(activations("block", rank), activations("lowrank", rank));
    EXPECT_LT(activations("lowrank", rank), activations("none", rank));
  }
}

// LaX over a pipeline (tp 2 x pp 2, three micro-batches in flight): its latents cross the
// stage boundary and every block; recomputation keeps them and changes no number.
TEST_F(TpCli, RecomputeOverAPipelineOfLax) {
  PolicyRuns runs;
  for (const std::string policy : {"none", "block", "lowrank"}) {
    const CommandResult r = run(fmt::format(
        "{} {} train {} --set parallel.tp=2 --set parallel.pp=2 --set model.bottleneck=lax --set "
        "model.num_layers=4 --set training.grad_accum_steps=3 --set training.steps=2 --set "
        "training.recompute={} --set checkpoint.folder={}",
        mpirun(4), bottle_binary(), dir / "tiny.toml", policy, dir / policy));
    ASSERT_EQ(r.status, 0) << r.output;
    runs[policy] = metrics_of(dir / (policy + "/metrics.jsonl"));
    ASSERT_EQ(runs[policy].size(), 2u);
    expect_comm_per_step(runs[policy], {"tp", "pp"});
  }
  expect_same_steps(runs);
}

// The JSON lines of `output`, by the name `key` gives each.
std::map<std::string, nlohmann::json> json_rows(
    const std::string& output, const std::function<std::string(const nlohmann::json&)>& key) {
  std::map<std::string, nlohmann::json> rows;
  std::istringstream lines(output);
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && line[0] == '{') {
      auto j = nlohmann::json::parse(line);
      rows[key(j)] = j;
    }
  return rows;
}
std::map<std::string, nlohmann::json> json_rows(const std::string& output, const char* key) {
  return json_rows(output, [key](const nlohmann::json& j) { return j.at(key).get<std::string>(); });
}

// bench tp on 2 ranks: one JSON line per mode and recompute policy with docs/design.md §16's keys,
// the exact volumes, and the collectives counted while recomputing.
TEST_F(TpCli, BenchTpPrintsEachModesVolumes) {
  const CommandResult r =
      run(fmt::format("{} {} bench tp {} --steps 1 --warmup 0 --json --recompute", mpirun(2),
                      bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto rows = json_rows(r.output, "variant");
  ASSERT_EQ(rows.size(), 7u) << r.output;
  for (const auto& [variant, j] : rows)
    for (const char* key :
         {"mode", "recompute", "fwd_elems_per_block", "bwd_elems_per_block",
          "collectives_per_block", "recompute_collectives", "comm_ms", "compute_ms", "iter_ms",
          "tokens_per_s", "peak_bytes", "activation_bytes", "buffer_bytes", "saved_mb",
          "recompute_ms", "saved_mb_per_ms"})
      EXPECT_TRUE(j.contains(key)) << variant << " lacks " << key;
  for (const auto& [variant, j] : rows) {
    const auto& ranks = j.at("memory_per_rank");
    for (const char* tag : {"weights", "gradients", "optimizer", "activations", "comm"})
      EXPECT_EQ(ranks.at(tag).size(), 2u) << variant << " " << tag;
    EXPECT_EQ(ranks.at("activations").at(0), j.at("activation_bytes")) << variant;
  }
  const double d = 32, dff = 48, r_ = 8;
  EXPECT_EQ(rows["full"].at("fwd_elems_per_token_block").get<double>(), 2 * d);
  EXPECT_EQ(rows["vanilla"].at("fwd_elems_per_token_block").get<double>(), 5 * d + 2 * dff);
  EXPECT_EQ(rows["btp"].at("fwd_elems_per_token_block").get<double>(), 7 * r_ + 2);
  EXPECT_EQ(rows["btp"].at("collectives_per_block").get<double>(), 4);
  // Recomputing a block re-runs its forward collectives; lowrank under btp runs none.
  EXPECT_EQ(rows["full recompute=block"].at("recompute_collectives").get<double>(), 2);
  EXPECT_EQ(rows["vanilla recompute=block"].at("recompute_collectives").get<double>(), 4);
  EXPECT_EQ(rows["vanilla recompute=block"].at("recompute_elems_per_block").get<double>(),
            rows["vanilla"].at("fwd_elems_per_block").get<double>());
  EXPECT_EQ(rows["btp recompute=block"].at("recompute_collectives").get<double>(), 4);
  EXPECT_EQ(rows["btp recompute=lowrank"].at("recompute_collectives").get<double>(), 0);
  EXPECT_EQ(rows["btp"].at("recompute_collectives").get<double>(), 0);
  for (const char* v : {"full recompute=block", "vanilla recompute=block", "btp recompute=block",
                        "btp recompute=lowrank"}) {
    EXPECT_GT(rows[v].at("saved_mb").get<double>(), 0) << v;
    EXPECT_GT(rows[v].at("recompute_ms").get<double>(), 0) << v;
    EXPECT_EQ(rows[v].at("weights_bytes"),
              rows[rows[v].at("mode").get<std::string>()].at("weights_bytes"))
        << v;
  }
}

// bench tp --fit plans without allocating: the largest micro-batch grows with what a
// policy recomputes, and a limit below the weights fits nothing.
TEST_F(TpCli, BenchTpFitPlansTheLargestMicroBatch) {
  const CommandResult r = run(fmt::format("{} {} bench tp {} --fit 12MiB --fit-max 16 --json",
                                          mpirun(2), bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto rows = json_rows(r.output, [](const nlohmann::json& j) {
    return j.at("mode").get<std::string>() + "/" + j.at("recompute").get<std::string>();
  });
  ASSERT_EQ(rows.size(), 7u) << r.output;
  auto batch = [&](const char* row) { return rows[row].at("max_micro_batch").get<int64_t>(); };
  EXPECT_GE(batch("btp/none"), 1) << r.output;
  EXPECT_GE(batch("btp/block"), batch("btp/lowrank"));
  EXPECT_GE(batch("btp/lowrank"), batch("btp/none"));
  EXPECT_GE(batch("vanilla/block"), batch("vanilla/none"));
  EXPECT_GE(batch("btp/none"), batch("vanilla/none"));
  for (const auto& [row, j] : rows) EXPECT_LE(j.at("total_bytes").get<int64_t>(), 12 << 20) << row;
  const CommandResult none = run(
      fmt::format("{} {} bench tp {} --fit 1KiB", mpirun(2), bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(none.status, 0) << none.output;
  EXPECT_EQ(count_occurrences(none.output, "does not fit"), 7) << none.output;
  const CommandResult bad =
      run(fmt::format("{} bench tp {} --fit lots", bottle_binary(), dir / "tiny.toml"));
  EXPECT_NE(bad.status, 0);
  EXPECT_EQ(count_occurrences(bad.output, "--fit: 'lots' is not a byte size"), 1) << bad.output;
}

// bench tp --components on 2 ranks: vanilla and btp, with grouping and without, time the
// compute and the all-reduces of their q/k/v and gate/up groups apart; a group's
// all-reduce time is the sum of its own call sites (one for the group, or one per member;
// forward and backward), and full times no group.
TEST_F(TpCli, BenchTpTimesEachGroupsComputeAndAllReduce) {
  const CommandResult r =
      run(fmt::format("{} {} bench tp {} --steps 1 --warmup 0 --json --variants --components",
                      mpirun(2), bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(r.status, 0) << r.output;
  auto rows = json_rows(r.output, "variant");
  ASSERT_EQ(rows.size(), 6u) << r.output;
  for (const auto& [variant, j] : rows)
    for (const std::string key : {"iter_ms", "comm_ms", "recompute_ms"}) {
      EXPECT_LE(j.at(key + "_min").get<double>(), j.at(key).get<double>()) << variant << key;
      EXPECT_GE(j.at(key + "_max").get<double>(), j.at(key).get<double>()) << variant << key;
    }
  EXPECT_FALSE(rows["full"].contains("qkv_compute_ms"));
  struct Expected {
    const char* variant;
    std::vector<std::string> qkv, gate_up;  // the group's call sites
  };
  const std::vector<Expected> expected{
      {"btp", {"btp.fwd.qkv", "btp.bwd.qkv"}, {"btp.fwd.gate_up", "btp.bwd.gate_up"}},
      {"btp ungrouped",
       {"btp.fwd.q", "btp.fwd.k", "btp.fwd.v", "btp.bwd.q", "btp.bwd.k", "btp.bwd.v"},
       {"btp.fwd.gate", "btp.fwd.up", "btp.bwd.gate", "btp.bwd.up"}},
      {"vanilla",
       {"vanilla.fwd.qkv_out", "vanilla.bwd.qkv_in"},
       {"vanilla.fwd.gate_up_out", "vanilla.bwd.gate_up_in"}},
      {"vanilla ungrouped",
       {"vanilla.fwd.q_out", "vanilla.fwd.k_out", "vanilla.fwd.v_out", "vanilla.bwd.q_in",
        "vanilla.bwd.k_in", "vanilla.bwd.v_in"},
       {"vanilla.fwd.gate_out", "vanilla.fwd.up_out", "vanilla.bwd.gate_in", "vanilla.bwd.up_in"}}};
  for (const Expected& e : expected) {
    const nlohmann::json& j = rows[e.variant];
    const nlohmann::json& sites = j.at("comm_ms_by_site");
    // Exposed (waited) and hidden time per site. The forward's collectives block, so all of
    // their time is exposed; the backward's input-gradient all-reduces run under the weight
    // gradients (parallel.tp_backward = "async"), so only what the pass waited for is.
    const nlohmann::json& exposed = j.at("comm_exposed_ms_by_site");
    for (const auto& [site, ms] : sites.items()) {
      ASSERT_TRUE(exposed.contains(site)) << e.variant << " " << site;
      const double waited = exposed.at(site).get<double>();
      if (site.find(".bwd.") == std::string::npos) {
        EXPECT_EQ(waited, ms.get<double>()) << e.variant << " " << site;
      } else {
        EXPECT_GE(waited, 0) << e.variant << " " << site;
        EXPECT_LE(waited, ms.get<double>()) << e.variant << " " << site;
      }
    }
    EXPECT_LE(j.at("comm_exposed_ms").get<double>(), j.at("comm_ms").get<double>()) << e.variant;
    for (const auto& [group, group_sites] :
         {std::pair{std::string("qkv"), e.qkv}, {std::string("gate_up"), e.gate_up}}) {
      EXPECT_GT(j.at(group + "_compute_ms").get<double>(), 0) << e.variant << " " << group;
      const double comm = j.at(group + "_comm_ms").get<double>();
      EXPECT_GT(comm, 0) << e.variant << " " << group;
      for (const char* suffix : {"_compute_ms", "_comm_ms"}) {
        EXPECT_LE(j.at(group + suffix + "_min").get<double>(), j.at(group + suffix).get<double>());
        EXPECT_GE(j.at(group + suffix + "_max").get<double>(), j.at(group + suffix).get<double>());
      }
      double sum = 0;
      for (const std::string& site : group_sites) {
        EXPECT_TRUE(sites.contains(site)) << e.variant << " lacks " << site << ": " << sites;
        if (sites.contains(site)) sum += sites.at(site).get<double>();
      }
      EXPECT_NEAR(comm, sum, 1e-9 + 1e-9 * sum) << e.variant << " " << group << ": " << sites;
    }
  }
}

// bench norm on 2 ranks: the online RMSNorm with a row-split linear layer matches RMSNorm
// + the linear layer on one rank to fp32 rounding, forward and backward; one report, from
// rank 0; a hidden width the ranks do not divide is one clear error.
TEST_F(TpCli, BenchNormMatchesOneRank) {
  const CommandResult r = run(fmt::format(
      "{} {} bench norm --rows 64 --hidden 512 --rank 128 --json", mpirun(2), bottle_binary()));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_EQ(count_occurrences(r.output, "\"max_abs_diff\""), 1) << r.output;
  const nlohmann::json j = nlohmann::json::parse(r.output.substr(r.output.find('{')));
  EXPECT_EQ(j.at("tp").get<int>(), 2);
  EXPECT_EQ(j.at("rows").get<int64_t>(), 64);
  EXPECT_EQ(j.at("hidden").get<int64_t>(), 512);
  EXPECT_EQ(j.at("rank").get<int64_t>(), 128);
  for (const std::string pass : {"", "bwd_"}) {
    const double max = j.at(pass + "max_abs_diff").get<double>(),
                 mean = j.at(pass + "mean_abs_diff").get<double>();
    EXPECT_LE(max, 1e-5) << pass << r.output;
    EXPECT_GE(mean, 0) << pass;
    EXPECT_LE(mean, max) << pass;
  }
  const CommandResult bad =
      run(fmt::format("{} {} bench norm --hidden 511", mpirun(2), bottle_binary()));
  EXPECT_NE(bad.status, 0);
  EXPECT_EQ(count_occurrences(bad.output, "--hidden 511 must be divisible by the number of ranks"),
            2)
      << bad.output;
}

}  // namespace
}  // namespace bottle::testing
