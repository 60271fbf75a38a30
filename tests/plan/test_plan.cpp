// bottle plan: cluster files (presets, round trip, every bad key named), NCCL's cost formulas,
// the dry run's TP volumes against the design's formulas at LLaMA-7B scale and against what
// `bench tp` counts, --calibrate, the paper's runs, and one clear error for each bad input.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "parallel/tp_layouts.h"
#include "plan/cluster.h"
#include "plan/cost_model.h"
#include "plan/dry_run.h"
#include "plan/planner.h"
#include "plan/timeline_replay.h"
#include "test_util.h"
#include "train/memory_plan.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

using testing::bottle_binary;
using testing::error_of;
using testing::mpirun;
using testing::run;
using testing::TempDir;
namespace fs = std::filesystem;

void write_file(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }

TEST(Cluster, PresetsCarryEveryKeyAndRoundTrip) {
  ASSERT_EQ(cluster_presets(), (std::vector<std::string>{"a100-perlmutter", "h100", "h200"}));
  for (const std::string& name : cluster_presets()) {
    SCOPED_TRACE(name);
    const ClusterSpec c = load_cluster(name);
    EXPECT_EQ(c.name, name);
    EXPECT_GT(c.bf16_tflops, c.fp32_tflops);
    EXPECT_GT(c.memory_gib, 0);
    EXPECT_GT(c.intra_node.bandwidth_gbs, c.inter_node.bandwidth_gbs);
    EXPECT_LE(c.gemm_efficiency, 1.0);
    const ClusterSpec again = parse_cluster(cluster_to_toml(c, "again"), "again");
    EXPECT_EQ(cluster_to_toml(again, "x"), cluster_to_toml(c, "x"));
  }
  // The paper's machine, from its spec sheets.
  const ClusterSpec a100 = load_cluster("a100-perlmutter");
  EXPECT_EQ(a100.bf16_tflops, 312.0);
  EXPECT_EQ(a100.gpus_per_node, 4);
  EXPECT_EQ(a100.intra_node.bandwidth_gbs, 300.0);
}

TEST(Cluster, BadFilesGetOneErrorNamingTheFileAndKey) {
  TempDir dir;
  const std::string good = cluster_to_toml(load_cluster("h100"), "test");
  auto without = [&](const std::string& key_line) {
    std::string text = good;
    const size_t at = text.find(key_line);
    EXPECT_NE(at, std::string::npos) << key_line;
    text.erase(at, text.find('\n', at) - at + 1);
    return text;
  };
  auto replaced = [&](const std::string& from, const std::string& to) {
    std::string text = good;
    text.replace(text.find(from), from.size(), to);
    return text;
  };
  const std::vector<std::pair<std::string, std::string>> cases{
      {without("bf16_tflops = "), "c.toml: key 'gpu.bf16_tflops' is missing"},
      {without("latency_us = "), "c.toml: key 'links.intra_node.latency_us' is missing"},
      {good + "\n[gpu2]\nspeed = 1\n", "c.toml: unknown key 'gpu2.speed'"},
      {replaced("memory_gib = 80.0", "memory_gib = 0.0"),
       "c.toml: key 'gpu.memory_gib' must be in [1e-06, 1e+06] (GiB), got 0"},
      {replaced("gemm = 0.8", "gemm = 1.5"),
       "c.toml: key 'efficiency.gemm' must be in [0.001, 1] (a share of the peak), got 1.5"},
      {replaced("gpus = 8", "gpus = 2.5"), "c.toml: key 'node.gpus' must be a whole number"},
      {replaced("gpus = 8", "gpus = \"eight\""), "c.toml: key 'node.gpus' must be a number"},
      {"[gpu\n", "c.toml: TOML syntax error at line 1"},
  };
  for (const auto& [text, expected] : cases) {
    write_file(dir / "c.toml", text);
    const std::string e = error_of([&] { load_cluster((dir / "c.toml")); });
    EXPECT_NE(e.find(expected), std::string::npos) << "got: " << e;
  }
  const std::string e = error_of([] { load_cluster("a300"); });
  EXPECT_NE(e.find("--cluster 'a300' is neither a preset (a100-perlmutter, h100, h200) nor a "
                   "cluster file"),
            std::string::npos)
      << e;
}

// Issue 57: every number of a cluster file is bounded, so that no price comes out infinite or
// NaN (a kernel overhead of 1e308 µs printed rows of -nan and inf, and exited 0): each key
// refuses 1e308, a negative, NaN and infinity with one error naming the file, the key and its
// range; a rate or bandwidth refuses 1e-300 too; the bounds themselves are taken.
TEST(Cluster, EveryNumberIsBoundedNamingTheKeyAndItsRange) {
  TempDir dir;
  const std::string good = cluster_to_toml(load_cluster("h100"), "test");
  // Each "name = number" line of the file: its key, and the text with the value replaced.
  std::vector<std::pair<std::string, size_t>> numbers;  // key, offset of the value
  std::string section;
  for (size_t at = 0; at < good.size();) {
    const size_t end = good.find('\n', at);
    const std::string line = good.substr(at, end - at);
    if (line.starts_with("[")) section = line.substr(1, line.size() - 2);
    const size_t eq = line.find(" = ");
    if (eq != std::string::npos && line.find('"') == std::string::npos)
      numbers.emplace_back(section + "." + line.substr(0, eq), at + eq + 3);
    at = end + 1;
  }
  ASSERT_GE(numbers.size(), 18u);
  auto with_value = [&](size_t offset, const std::string& value) {
    std::string text = good;
    text.replace(offset, text.find('\n', offset) - offset, value);
    return text;
  };
  for (const auto& [key, offset] : numbers) {
    std::vector<std::string> bad{"1e308", "-1.0", "nan", "inf"};
    if (key.ends_with("tflops") || key.ends_with("bandwidth_gbs")) bad.push_back("1e-300");
    for (const std::string& value : bad) {
      SCOPED_TRACE(key + " = " + value);
      write_file(dir / "c.toml", with_value(offset, value));
      const std::string e = error_of([&] { load_cluster((dir / "c.toml")); });
      EXPECT_NE(e.find("c.toml: key '" + key + "' must be"), std::string::npos) << "got: " << e;
      if (key != "node.gpus") EXPECT_NE(e.find("] ("), std::string::npos) << "no range: " << e;
    }
  }
  for (const auto& [from, to] : {std::pair{"kernel_overhead_us = 0.0", "kernel_overhead_us = 1e6"},
                                 {"memory_gib = 80.0", "memory_gib = 1e6"},
                                 {"gemm = 0.8", "gemm = 0.001"}}) {
    std::string text = good;
    text.replace(text.find(from), std::string_view(from).size(), to);
    write_file(dir / "c.toml", text);
    EXPECT_EQ(error_of([&] { load_cluster((dir / "c.toml")); }), "") << to;
  }
}

// NCCL's tuner (src/graph/tuning.cc, Simple protocol) as the cost model applies it: ring steps
// inside a node at NVLink's latency, the ones between nodes at the network's; the tree only
// where it is cheaper; the bottleneck link's bandwidth.
TEST(CostModel, NcclRingAndTreeFormulas) {
  const ClusterSpec c = load_cluster("a100-perlmutter");
  const double nvlink = 300e9 * 0.8, net = 25e9 * 0.8, a = 8.4e-6, alpha = 3.4e-6,
               alpha_net = 14e-6;
  const double mib128 = double(128 << 20);
  // 4 ranks of one node, 128 MiB: the ring, 2(n−1) NVLink steps.
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::all_reduce, mib128, 4, 1),
                   a + 6 * alpha + 1.5 * mib128 / nvlink);
  // 16 ranks on 4 nodes, 4 bytes: the tree's 2((n/N − 1)α + log₂N·α') beats the ring's
  // (2(n−1) − 2(N−1))α + 2(N−1)α'.
  const double tree = a + 2 * (3 * alpha + 2 * alpha_net) + 2 * 4 / net;
  const double ring = a + 24 * alpha + 6 * alpha_net + 2 * 15.0 / 16 * 4 / net;
  ASSERT_LT(tree, ring);
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::all_reduce, 4, 16, 4), tree);
  // Inside one node a tree is a chain: the ring wins.
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::all_reduce, 4, 4, 1),
                   a + 6 * alpha + 1.5 * 4 / nvlink);
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::all_gather, double(2 << 20), 4, 1),
                   a + 3 * alpha + 0.75 * double(2 << 20) / nvlink);
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::send, 2000, 2, 2), alpha_net + 2000 / net);
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::recv, 2000, 2, 2), 0);
}

// A transport that sends small messages another way (MPI's eager messages, NCCL's LL): up to
// nccl.small_message_bytes they pay the links' small_latency_us per step, above it
// latency_us; a file without the small latencies prices every message alike, and both keys
// read back as written.
TEST(CostModel, SmallMessagesPayTheirOwnLatency) {
  std::string text = cluster_to_toml(load_cluster("a100-perlmutter"), "small");
  auto set = [&](const std::string& from, const std::string& to) {
    const size_t at = text.find(from);
    ASSERT_NE(at, std::string::npos) << from;
    text.replace(at, from.size(), to);
  };
  set("small_latency_us = 3.4", "small_latency_us = 1.5");
  set("small_latency_us = 14.0", "small_latency_us = 6.0");
  set("small_message_bytes = 0.0", "small_message_bytes = 65536.0");
  const ClusterSpec c = parse_cluster(text, "small.toml");
  EXPECT_EQ(c.intra_node.small_latency_us, 1.5);
  EXPECT_EQ(c.inter_node.small_latency_us, 6.0);
  EXPECT_EQ(c.small_message_bytes, 65536.0);
  EXPECT_EQ(cluster_to_toml(parse_cluster(cluster_to_toml(c, "x"), "again"), "x"),
            cluster_to_toml(c, "x"));
  const double nvlink = 300e9 * 0.8, net = 25e9 * 0.8, a = 8.4e-6;
  // Two ranks of a node: 2(n − 1) steps at the small latency up to 64 KiB, at NVLink's above.
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::all_reduce, 65536, 2, 1),
                   a + 2 * 1.5e-6 + 65536 / nvlink);
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::all_reduce, 65537, 2, 1),
                   a + 2 * 3.4e-6 + 65537 / nvlink);
  // Across nodes the network's steps too.
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::send, 2000, 2, 2), 6e-6 + 2000 / net);
  EXPECT_DOUBLE_EQ(collective_seconds(c, Collective::send, 1 << 20, 2, 2), 14e-6 + (1 << 20) / net);
  // The preset gives no small latencies: a small message pays the large one's.
  const ClusterSpec preset = load_cluster("a100-perlmutter");
  EXPECT_LT(preset.intra_node.small_latency_us, 0);
  EXPECT_DOUBLE_EQ(collective_seconds(preset, Collective::all_reduce, 4096, 2, 1),
                   a + 2 * 3.4e-6 + 4096 / nvlink);
}

// Four GPUs a node, world ranks TP fastest: which nodes a group's ranks span.
TEST(CostModel, GroupsSpanTheNodesTheirRanksSitOn) {
  const ClusterSpec c = load_cluster("a100-perlmutter");
  EXPECT_EQ(nodes_spanned(c, 0, 4, 1), 1);   // TP 4
  EXPECT_EQ(nodes_spanned(c, 3, 3, 1), 2);   // TP 3 from rank 3: {3, 4, 5} straddles
  EXPECT_EQ(nodes_spanned(c, 0, 2, 2), 1);   // tp 2 × pp 2: neighbouring stages share a node
  EXPECT_EQ(nodes_spanned(c, 2, 2, 2), 2);   // ... stages 1 and 2 of tp 2 × pp 4 do not
  EXPECT_EQ(nodes_spanned(c, 0, 2, 28), 2);  // the tied embedding of tp 4 × pp 8: ends apart
  EXPECT_EQ(nodes_spanned(c, 0, 8, 4), 8);
}

// A pipeline's sends cross nodes only where its stages do: tp 2 × pp 4 on 4-GPU nodes puts
// stages 0-1 and 2-3 together, so the sends of stage 0 stay on NVLink and stage 1's to 2 do
// not; and an fp32 run's attention runs at the fp32 peak (the step never beats its bound).
TEST(Planner, PricesSendsOnTheLinkBetweenTheStages) {
  const ClusterSpec c = load_cluster("a100-perlmutter");
  const std::string model = R"([model]
vocab_size = 32000
hidden_size = 2048
intermediate_size = 5504
num_layers = 8
num_heads = 16
bottleneck = "cola"
rank = 512
max_seq_len = 2048
[training]
micro_batch_size = 2
seq_len = 2048
grad_accum_steps = 4
)";
  for (const char* precision : {"bf16", "fp32"}) {
    SCOPED_TRACE(precision);
    const TrainConfig config = parse_train_config_string(
        model + fmt::format("precision = \"{}\"\n[parallel]\ntp = 2\npp = 4\n", precision),
        "pp.toml");
    const Prediction p = predict(config, c);
    ASSERT_TRUE(p.excluded.empty()) << p.excluded;
    EXPECT_GT(p.p2p, 0);
    EXPECT_GT(p.bubble, 0);
    EXPECT_GT(p.step, p.peak_bound);
    // The slowest stage sends over the network (stage 1 or 2), each of its 2m sends at least
    // the network's latency.
    EXPECT_GT(p.p2p, 2 * 4 * 14e-6);
  }
}

// The replay's rule (plan/timeline_replay.h) on timelines worked by hand.
TEST(TimelineReplay, HoldsKernelsOnlyWhereACallIsWaitedFor) {
  using K = TimedEvent::Kind;
  // Serially every call is blocking: all of it is exposed.
  const std::vector<TimedEvent> serial = {
      {K::work, 1.0}, {K::issue, 2.0, 0, false}, {K::work, 1.0}, {K::issue, 0.5, 1, false}};
  const ReplayTimes s = replay_timeline(serial);
  EXPECT_DOUBLE_EQ(s.kernels, 2.0);
  EXPECT_DOUBLE_EQ(s.calls, 2.5);
  EXPECT_DOUBLE_EQ(s.end, 4.5);
  EXPECT_DOUBLE_EQ(s.hidden(), 0.0);
  // Two halves as run_halves interleaves them: A computes, starts its call, B computes and
  // starts its call, which waits for the link until A's has gone (2.5 to 4); A resumes after
  // its call (2.5 to 3.5) and B after its own (4 to 5). 1 s of the 3 s of calls is exposed.
  const std::vector<TimedEvent> halves = {
      {K::work, 1.0},  {K::issue, 1.5, 0, true}, {K::work, 1.0},  {K::issue, 1.5, 1, true},
      {K::wait, 0, 0}, {K::work, 1.0},           {K::wait, 0, 1}, {K::work, 1.0}};
  const ReplayTimes h = replay_timeline(halves);
  EXPECT_DOUBLE_EQ(h.kernels, 4.0);
  EXPECT_DOUBLE_EQ(h.calls, 3.0);
  EXPECT_DOUBLE_EQ(h.end, 5.0);
  EXPECT_DOUBLE_EQ(h.exposed(), 1.0);
  EXPECT_DOUBLE_EQ(h.hidden(), 2.0);
  // A blocking call waits for the link behind a started one.
  const std::vector<TimedEvent> queued = {
      {K::issue, 3.0, 0, true}, {K::work, 1.0}, {K::issue, 1.0, 1, false}, {K::wait, 0, 0}};
  EXPECT_DOUBLE_EQ(replay_timeline(queued).end, 4.0);
  // Kernels twice as slow beside a call on the link: A's call (1 to 2.5) leaves B's first
  // kernel 0.75 s of work done at 2.5 and the rest at 2.75; B's call (2.75 to 4.25) holds A's
  // second kernel at half speed until 4.25, whose rest ends at 4.5; B's last runs alone.
  // Everything is hidden and the kernels lost 1.5 s: 5.5 s against 7 s serially.
  const ReplayTimes slow = replay_timeline(halves, 2.0);
  EXPECT_DOUBLE_EQ(slow.end, 5.5);
  EXPECT_DOUBLE_EQ(slow.stretch, 1.5);
  EXPECT_DOUBLE_EQ(slow.exposed(), 0.0);
  EXPECT_DOUBLE_EQ(slow.hidden(), 3.0);
  // A blocking call holds the kernels, so nothing runs beside it.
  EXPECT_DOUBLE_EQ(replay_timeline(serial, 2.0).end, 4.5);
  EXPECT_DOUBLE_EQ(replay_timeline(serial, 2.0).stretch, 0.0);
  // A wait for a call that is not pending is a bug of the recorder.
  const std::vector<TimedEvent> stray = {{K::wait, 0, 7}};
  EXPECT_THROW(replay_timeline(stray), InternalError);
}

// The shape the overlap tests plan (a 2048-wide model of 4 blocks, bf16), from the model's
// keys after its bottleneck to the [parallel] header; each test adds its layout.
constexpr const char* kOverlapShape = R"(vocab_size = 32000
hidden_size = 2048
intermediate_size = 5504
num_layers = 4
num_heads = 16
rank = 512
max_seq_len = 2048
[training]
micro_batch_size = 4
seq_len = 2048
precision = "bf16"
[parallel]
)";

// `c` where overlapping costs what it says: kernels beside a call run 1 + compute_slowdown
// times slower, a started call takes 1 + call_slowdown times its blocking price.
ClusterSpec with_overlap_costs(ClusterSpec c, double compute_slowdown, double call_slowdown) {
  c.overlap_compute_slowdown = compute_slowdown;
  c.overlap_call_slowdown = call_slowdown;
  return c;
}

// Under parallel.tp_overlap the dry run records every TP call in issue order with the waits
// for the started ones, and the planner hides part of them: never more than the calls or the
// kernels they run under, a good part where the link is slow, nothing on a free link.
TEST(Planner, ReplaysTpOverlapsTimeline) {
  ClusterSpec slow = load_cluster("a100-perlmutter");
  slow.intra_node = {10.0, 5.0};  // 10 GB/s: the calls cost more than the kernels
  for (const char* mode : {"full", "vanilla", "btp"}) {
    SCOPED_TRACE(mode);
    TrainConfig serial = parse_train_config_string(
        fmt::format("[model]\nbottleneck = \"{}\"\n{}tp = 2\ntp_mode = \"{}\"\n",
                    std::string_view(mode) == "full" ? "none" : "cola", kOverlapShape, mode),
        "overlap.toml");
    // Every TP call blocking: the TP backward's all-reduces after the weight gradients too.
    serial.parallel.tp_backward = TpBackward::serial;
    TrainConfig overlap = serial;
    overlap.parallel.tp_overlap = true;
    EXPECT_TRUE(dry_run_stage(serial, 0).tp_timeline.empty());
    const StageCounts counts = dry_run_stage(overlap, 0);
    int64_t calls = 0, issued = 0, started = 0, waited = 0;
    for (const auto& [call, n] : counts.calls.at("tp")) calls += n;
    std::set<int64_t> pending;
    for (const TpTimelineEvent& e : counts.tp_timeline) {
      if (e.kind == TpTimelineEvent::Kind::issue) {
        ++issued;
        if (e.started) {
          ++started;
          pending.insert(e.id);
        }
      } else if (e.kind == TpTimelineEvent::Kind::wait) {
        ++waited;
        EXPECT_EQ(pending.erase(e.id), 1u) << "a wait before its call, or twice";
      }
    }
    EXPECT_EQ(issued, calls);
    EXPECT_GT(started, 0);
    EXPECT_EQ(waited, started);
    EXPECT_TRUE(pending.empty());

    const Prediction s = predict(serial, slow), o = predict(overlap, slow);
    ASSERT_TRUE(o.excluded.empty()) << o.excluded;
    EXPECT_EQ(s.tp_hidden, 0);
    // Hidden time runs under the other half's kernels: at most the calls or the kernels,
    // whichever is less, and here a good part of that (a block's calls alternate with its
    // kernels).
    const double bound = std::min(o.tp_comm + o.tp_hidden, o.compute);
    EXPECT_GT(o.tp_hidden, 0.3 * bound);
    EXPECT_LE(o.tp_hidden, bound);
    EXPECT_GE(o.tp_comm, 0);
    EXPECT_LT(o.step, s.step);
    EXPECT_TRUE(prediction_json(o).contains("tp_hidden_s"));
    EXPECT_FALSE(prediction_json(s).contains("tp_hidden_s"));
    // On a link that costs nothing there is nothing to hide.
    ClusterSpec free_link = slow;
    free_link.intra_node = {1e12, 0.0};
    free_link.nccl_base_latency_us = 0;
    const Prediction f = predict(overlap, free_link);
    EXPECT_NEAR(f.tp_comm + f.tp_hidden, 0, 1e-6);
    // Where kernels beside a transfer run twice as slow (overlap.compute_slowdown 1), overlap
    // pays for what it hides: the kernels lose at most half the calls' time (of each second
    // beside a call they do half a second's work), and the step grows.
    const Prediction c = predict(overlap, with_overlap_costs(slow, 1.0, 0.0));
    EXPECT_GT(c.tp_contention, 0);
    EXPECT_LE(c.tp_contention, 0.5 * (o.tp_comm + o.tp_hidden) + 1e-9);
    // (Vanilla's link is the bottleneck here: its kernels' loss fills time they would have
    // waited anyway.)
    EXPECT_GE(c.step, o.step);
    if (std::string_view(mode) != "vanilla") {
      EXPECT_GT(c.step, o.step);
    }
    EXPECT_EQ(o.tp_contention, 0);
    EXPECT_DOUBLE_EQ(prediction_json(c).at("tp_contention_s").get<double>(), c.tp_contention);
    // Started calls that take half again their blocking time (overlap.call_slowdown 0.5) cost
    // that much more of themselves, some of it hidden again: never a faster step.
    const Prediction sc = predict(overlap, with_overlap_costs(slow, 0.0, 0.5));
    EXPECT_GT(sc.tp_contention, 0);
    EXPECT_GE(sc.step, o.step);

    // The async TP backward (parallel.tp_backward's default) without TP overlap: each input
    // gradient's all-reduce hides under its layer's weight gradient, in backward only. A step
    // of many micro-batches is extrapolated from two short ones, and what their timeline hides
    // is scaled to it: per micro-batch the same as a step replayed whole.
    TrainConfig async = serial;
    async.parallel.tp_backward = TpBackward::async;
    const Prediction a = predict(async, slow);
    ASSERT_TRUE(a.excluded.empty()) << a.excluded;
    EXPECT_GT(a.tp_hidden, 0);
    EXPECT_LE(a.tp_hidden, std::min(a.tp_comm + a.tp_hidden, a.compute));
    EXPECT_LT(a.step, s.step);
    EXPECT_TRUE(prediction_json(a).contains("tp_hidden_s"));
    TrainConfig longer = async;
    longer.training.grad_accum_steps = 12;
    const StageCounts long_counts = dry_run_stage(longer, 0);
    EXPECT_LT(long_counts.timeline_micro_batches, 12) << "extrapolated, not run whole";
    const Prediction l = predict(longer, slow);
    EXPECT_NEAR(l.tp_hidden / 12, a.tp_hidden / double(async.training.grad_accum_steps),
                0.05 * a.tp_hidden / double(async.training.grad_accum_steps));
  }
}

// Gradient buckets reduced during backward (parallel.overlap_grad_reduce) hide part of the DP
// all-reduce; what overlapping costs on a cluster that says so (overlap.compute_slowdown,
// overlap.call_slowdown) comes back as dp_contention, in dp_comm.
TEST(Planner, HidesGradientBucketsAndPricesWhatOverlapCosts) {
  ClusterSpec c = load_cluster("a100-perlmutter");
  c.gpus_per_node = 1;         // DP 2 across the network
  c.inter_node = {2.0, 14.0};  // 2 GB/s: the all-reduce weighs
  TrainConfig serial = parse_train_config_string(
      fmt::format("[model]\nbottleneck = \"cola\"\n{}dp = 2\nbucket_mb = 16\n", kOverlapShape),
      "dp.toml");
  serial.parallel.overlap_grad_reduce = false;
  TrainConfig overlap = serial;
  overlap.parallel.overlap_grad_reduce = true;
  const Prediction s = predict(serial, c), o = predict(overlap, c);
  ASSERT_TRUE(o.excluded.empty()) << o.excluded;
  EXPECT_EQ(s.dp_hidden, 0);
  EXPECT_GT(o.dp_hidden, 0);
  EXPECT_NEAR(o.dp_comm + o.dp_hidden, s.dp_comm, 1e-9);  // what is hidden leaves the tail
  EXPECT_LT(o.step, s.step);
  EXPECT_EQ(o.dp_contention, 0);
  EXPECT_FALSE(prediction_json(o).contains("dp_contention_s"));
  // Kernels twice as slow beside the buckets: of the hidden seconds, half come back.
  const Prediction k = predict(overlap, with_overlap_costs(c, 1.0, 0.0));
  EXPECT_DOUBLE_EQ(k.dp_hidden, o.dp_hidden);
  EXPECT_NEAR(k.dp_contention, 0.5 * k.dp_hidden, 1e-12);
  EXPECT_NEAR(k.step - o.step, k.dp_contention, 1e-9);
  EXPECT_DOUBLE_EQ(prediction_json(k).at("dp_contention_s").get<double>(), k.dp_contention);
  // Buckets that take twice their blocking time on the communication thread: the extra is in
  // dp_contention, and the step is no faster than the serial one's tail plus that extra.
  const Prediction sc = predict(overlap, with_overlap_costs(c, 0.0, 1.0));
  EXPECT_GT(sc.dp_contention, 0);
  EXPECT_GT(sc.step, o.step);
  EXPECT_LE(sc.step, s.step + sc.dp_contention + 1e-9);
}

// Every counter of two dry runs, and their memory plans.
void expect_same_counts(const StageCounts& a, const StageCounts& b) {
  ASSERT_EQ(a.ops.size(), b.ops.size());
  for (const auto& [phase, ops] : a.ops) {
    SCOPED_TRACE("phase '" + phase + "'");
    ASSERT_TRUE(b.ops.count(phase));
    const OpCounts& other = b.ops.at(phase);
    EXPECT_EQ(ops.gemms, other.gemms);
    ASSERT_EQ(ops.kernels.size(), other.kernels.size());
    for (const auto& [name, k] : ops.kernels) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(other.kernels.count(name));
      EXPECT_EQ(k.calls, other.kernels.at(name).calls);
      EXPECT_EQ(k.flops, other.kernels.at(name).flops);
      EXPECT_EQ(k.bytes, other.kernels.at(name).bytes);
    }
  }
  EXPECT_EQ(a.calls, b.calls);
  EXPECT_EQ(a.host_waits, b.host_waits);
  EXPECT_EQ(a.model_flops, b.model_flops);
  EXPECT_EQ(a.memory.bytes, b.memory.bytes);
  EXPECT_EQ(a.memory.attention, b.memory.attention);
}

// The dry run's cost does not grow with the micro-batches: it runs two short steps and
// extrapolates (dry_run.cpp). Against the step of every micro-batch, every counter and the
// memory plan are the same, bit for bit, for each TP mode, ZeRO level, overlap, schedule,
// recompute policy and pipeline stage; and the memory plan of many slots equals the memory
// planner's.
TEST(Planner, ExtrapolatesTheMicroBatchesExactly) {
  struct Shape {
    const char* bottleneck;
    const char* mode;
    const char* recompute;
    int tp;
  };
  const Shape shapes[] = {{"none", "full", "none", 2},
                          {"cola", "vanilla", "block", 2},
                          {"cola", "btp", "lowrank", 2},
                          {"lax", "btp", "none", 1},
                          {"svd", "btp", "block", 1}};
  int extrapolated = 0;
  for (const Shape& sh : shapes)
    for (int zero = 0; zero <= 3; ++zero)
      for (const auto& [pp, dp, schedule] : {std::tuple{1, 2, "1f1b"}, std::tuple{3, 1, "1f1b"},
                                             std::tuple{3, 2, "1f1b"}, std::tuple{2, 2, "gpipe"}})
        for (const bool overlap : {false, true}) {  // both DP overlaps
          if ((zero > 0 || overlap) && dp == 1) continue;
          const std::string text = fmt::format(
              R"([model]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_layers = 12
num_heads = 4
num_kv_heads = 2
bottleneck = "{}"
rank = 8
max_seq_len = 16
tie_embeddings = {}
[training]
micro_batch_size = 2
seq_len = 16
grad_accum_steps = 11
recompute = "{}"
precision = "{}"
[parallel]
tp = {}
pp = {}
dp = {}
tp_mode = "{}"
schedule = "{}"
zero = {}
overlap_grad_reduce = {}
overlap_param_gather = {}
bucket_mb = 0.002
)",
              sh.bottleneck, pp == 3 ? "true" : "false", sh.recompute, zero == 2 ? "bf16" : "fp32",
              sh.tp, pp, dp, sh.mode, schedule, zero, overlap, overlap);
          const TrainConfig config = parse_train_config_string(text, "extrapolate.toml");
          for (int stage = 0; stage < pp; ++stage) {
            SCOPED_TRACE(fmt::format("{} {} {} zero {} pp {} dp {} {} stage {}", sh.bottleneck,
                                     sh.mode, sh.recompute, zero, pp, dp, schedule, stage));
            const StageCounts fast = dry_run_stage(config, stage);
            const StageCounts whole = dry_run_step(config, stage);
            expect_same_counts(fast, whole);
            CountingCommunicator tp("tp", sh.tp, 0);
            const MemoryBreakdown planned =
                plan_rank_memory(config, tensor_parallel_of(config, &tp), PipelineStage{pp, stage},
                                 pipeline_slots(config, stage));
            EXPECT_EQ(fast.memory.bytes, planned.bytes);
            ++extrapolated;
          }
        }
  EXPECT_GT(extrapolated, 100);
  // Past 64 micro-batches the slots in flight are not listed from the schedule: a long step's
  // memory plan is still the memory planner's.
  for (const char* parallel : {"pp = 2\nschedule = \"gpipe\"", "pp = 3\nschedule = \"1f1b\""}) {
    const TrainConfig config = parse_train_config_string(
        fmt::format("[model]\nvocab_size = 64\nhidden_size = 32\nintermediate_size = 64\n"
                    "num_layers = 6\nnum_heads = 4\nrank = 8\nmax_seq_len = 16\n[training]\n"
                    "micro_batch_size = 1\nseq_len = 16\ngrad_accum_steps = 100\n[parallel]\n{}\n",
                    parallel),
        "long.toml");
    for (int stage = 0; stage < int(config.parallel.pp); ++stage) {
      SCOPED_TRACE(fmt::format("{} stage {}", parallel, stage));
      CountingCommunicator tp("tp", 1, 0);
      EXPECT_EQ(dry_run_stage(config, stage).memory.bytes,
                plan_rank_memory(config, tensor_parallel_of(config, &tp),
                                 PipelineStage{int(config.parallel.pp), stage},
                                 pipeline_slots(config, stage))
                    .bytes);
    }
  }
}

// Issue 58: `bottle plan` counts Muon. Its Newton–Schulz GEMMs and its collectives (btp's Gram
// all-reduces, vanilla's gathers, ZeRO's exchanges with the owners) run under the optimizer's
// phase and are priced as the step's tail, the blocks' work is AdamW's, the state is one
// momentum for the matrices and AdamW's two moments for the rest, and the counts extrapolated
// from shorter steps are the whole step's.
// zb_h1 (a split backward): the dry run counts the W passes' kernels under their own phase,
// which the planner prices as the pipeline's W passes; they are first-pass work (the model's
// FLOPs are 1f1b's), and the step extrapolated from short ones counts them exactly.
TEST(Planner, PricesZbH1sWeightPassFromTheDryRun) {
  const ClusterSpec cluster = load_cluster("h100");
  auto config_of = [](const char* schedule) {
    return parse_train_config_string(
        fmt::format("[model]\nvocab_size = 64\nhidden_size = 32\nintermediate_size = 64\n"
                    "num_layers = 4\nnum_heads = 4\nbottleneck = \"cola\"\nrank = 8\n"
                    "max_seq_len = 16\n[training]\nmicro_batch_size = 2\nseq_len = 16\n"
                    "grad_accum_steps = 9\n[parallel]\npp = 2\nschedule = \"{}\"\n",
                    schedule),
        "zb.toml");
  };
  const TrainConfig zb = config_of("zb_h1"), one = config_of("1f1b");
  for (int stage : {0, 1}) {
    SCOPED_TRACE(stage);
    const StageCounts split = dry_run_stage(zb, stage), whole = dry_run_stage(one, stage);
    ASSERT_TRUE(split.ops.count(kWeightPassPhase));
    EXPECT_FALSE(whole.ops.count(kWeightPassPhase));
    EXPECT_DOUBLE_EQ(split.model_flops, whole.model_flops);
    const double w = split.ops.at(kWeightPassPhase).gemm_flops(),
                 first = split.ops.at("").gemm_flops() + w;
    // dW of each projection has its forward GEMM's FLOPs: about a third of them.
    EXPECT_GT(w / first, 0.2);
    EXPECT_LT(w / first, 0.4);
    expect_same_counts(split, dry_run_step(zb, stage));
  }
  const Prediction a = predict(zb, cluster), b = predict(one, cluster);
  ASSERT_TRUE(a.excluded.empty()) << a.excluded;
  // The same work, and the copies of the residual's gradient that W reads (a few percent here).
  EXPECT_GE(a.compute, b.compute);
  EXPECT_LT(a.compute, 1.05 * b.compute);
  EXPECT_LT(a.bubble, b.bubble);
}

TEST(Planner, CountsMuonAsTheStepsTail) {
  const ClusterSpec cluster = load_cluster("h100");
  for (const auto& [mode, dp, zero] : {std::tuple{"btp", 1, 0}, std::tuple{"vanilla", 1, 0},
                                       std::tuple{"btp", 2, 1}, std::tuple{"btp", 2, 3}}) {
    SCOPED_TRACE(fmt::format("{} dp {} zero {}", mode, dp, zero));
    auto config_of = [&](const char* optimizer) {
      return parse_train_config_string(
          fmt::format("[model]\nvocab_size = 64\nhidden_size = 32\nintermediate_size = 64\n"
                      "num_layers = 4\nnum_heads = 4\nbottleneck = \"cola\"\nrank = 8\n"
                      "max_seq_len = 16\n[training]\nmicro_batch_size = 2\nseq_len = 16\n"
                      "grad_accum_steps = 9\n[optimizer]\nname = \"{}\"\n[parallel]\ntp = 2\n"
                      "tp_mode = \"{}\"\ndp = {}\nzero = {}\n",
                      optimizer, mode, dp, zero),
          "muon.toml");
    };
    const TrainConfig adamw = config_of("adamw"), muon = config_of("muon");
    const Prediction a = predict(adamw, cluster), m = predict(muon, cluster);
    EXPECT_GT(m.optimizer, a.optimizer);
    EXPECT_DOUBLE_EQ(m.compute, a.compute);
    EXPECT_DOUBLE_EQ(m.tp_comm, a.tp_comm);
    EXPECT_LT(m.memory[MemoryTag::optimizer], a.memory[MemoryTag::optimizer]);
    const StageCounts fast = dry_run_stage(muon, 0), whole = dry_run_step(muon, 0);
    expect_same_counts(fast, whole);
    ASSERT_TRUE(whole.ops.count(kOptimizerPhase));
    EXPECT_GT(whole.ops.at(kOptimizerPhase).gemm_flops(), 0);
    std::set<std::string> sites;
    for (const auto& [group, calls] : whole.calls)
      for (const auto& [call, count] : calls)
        if (call.site.starts_with(kOptimizerPhase)) sites.insert(call.site);
    EXPECT_TRUE(sites.count(std::string(kOptimizerPhase) +
                            (std::string(mode) == "btp" ? "tp.muon_gram" : "tp.muon_gather")));
    if (zero) EXPECT_TRUE(sites.count(std::string(kOptimizerPhase) + "dp.muon_gather"));
  }
}

constexpr const char* kTinyModel = R"([model]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_layers = 2
num_heads = 4
bottleneck = "cola"
rank = 8
max_seq_len = 16
[training]
micro_batch_size = 1
seq_len = 16
)";

// Issue 57: the planner's time and memory grew with the layer count without bound (a billion
// blocks took 6 GB and ran out of memory): a model of more blocks than it plans is refused at
// once, naming model.num_layers and the bound.
TEST(Planner, RefusesMoreBlocksThanItPlansAtOnce) {
  TrainConfig config = parse_train_config_string(kTinyModel, "deep.toml");
  config.model.num_layers = 1'000'000'000;
  const auto start = std::chrono::steady_clock::now();
  for (const std::string& e :
       {error_of([&] { plan_layouts(config, load_cluster("h100"), PlanRequest{}); }),
        error_of([&] { predict(config, load_cluster("h100")); })}) {
    EXPECT_NE(e.find("model.num_layers = 1000000000: bottle plan plans at most 1024 blocks"),
              std::string::npos)
        << e;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  config.model.num_layers = 1024;
  check_plannable(config.model);  // the bound itself is planned
}

// Issue 57: a step of a million micro-batches plans in the time of a few (the dry run
// extrapolates; it used to run each, and refused more than 4,096), its token buffers planned
// for every one.
TEST(Planner, PlansAMillionMicroBatchesAsQuicklyAsAFew) {
  const TrainConfig config = parse_train_config_string(kTinyModel, "long.toml");
  PlanRequest request;
  request.global_batch = int64_t(1) << 20;
  request.full_rank_baseline = false;
  const std::vector<Prediction> rows = plan_layouts(config, load_cluster("h100"), request);
  int64_t longest = 0;
  for (const Prediction& r : rows) {
    EXPECT_TRUE(r.excluded.empty()) << r.label() << ": " << r.excluded;
    if (!r.excluded.empty()) continue;
    const int64_t m = r.config.training.grad_accum_steps;
    longest = std::max(longest, m);
    const int64_t tokens = r.config.training.micro_batch_size * r.config.training.seq_len;
    EXPECT_GE(r.memory[MemoryTag::workspace], size_t(2 * m * tokens * 4)) << r.label();
    EXPECT_GT(r.tokens_per_s, 0) << r.label();
  }
  EXPECT_EQ(longest, int64_t(1) << 20);
  // More micro-batches than --global-batch allows are one exclusion, not a wrong number.
  TrainConfig more = config;
  more.training.grad_accum_steps = (int64_t(1) << 24) + 1;
  EXPECT_NE(predict(more, load_cluster("h100")).excluded.find("the planner plans at most"),
            std::string::npos);
  // Under parallel.tp_overlap every micro-batch is still dry-run: a bound on the block passes.
  TrainConfig overlap = config;
  overlap.parallel.tp = 2;
  overlap.parallel.tp_overlap = true;
  overlap.training.micro_batch_size = 2;
  overlap.training.grad_accum_steps = 65537;  // × 2 blocks: one pass more than 4,096 × 32
  EXPECT_NE(predict(overlap, load_cluster("h100"))
                .excluded.find("65537 micro-batches per step of 2 blocks a stage: under "
                               "parallel.tp_overlap the dry run runs every one"),
            std::string::npos);
}

// Issue 57: where no layout fits, the planner says so in a sentence and why: the smallest plan
// against the GPU's memory, by tag, and what would lower it; where every layout is excluded,
// that.
TEST(Planner, SaysWhyNothingFits) {
  const TrainConfig config = parse_train_config_string(kTinyModel, "big.toml");
  ClusterSpec small = load_cluster("h100");
  PlanRequest request;
  request.gpus = 2;
  request.global_batch = 2;
  EXPECT_EQ(nothing_fits(plan_layouts(config, small, request), small, config, 2), "");
  small.memory_gib = 1e-5;  // 10 KiB
  const std::vector<Prediction> rows = plan_layouts(config, small, request);
  const std::string why = nothing_fits(rows, small, config, 2);
  size_t smallest = SIZE_MAX;
  for (const Prediction& r : rows)
    if (r.excluded.empty()) smallest = std::min(smallest, r.memory.total());
  ASSERT_NE(smallest, SIZE_MAX);
  for (const std::string& part :
       {std::string("No layout fits the 1e-05 GiB of a NVIDIA H100-SXM5-80GB.\n  The smallest "
                    "plan, "),
        fmt::format("needs {} on its largest rank", format_bytes(smallest)),
        std::string("activations "), std::string("more GPUs (--gpus)"),
        std::string("parallel.zero (0, where dp > 1)")})
    EXPECT_NE(why.find(part), std::string::npos) << part << " in\n" << why;
  request.gpus = 3;  // nothing of this model splits 3 ways by TP
  request.global_batch = 3;
  request.tp = 3;
  EXPECT_EQ(nothing_fits(plan_layouts(config, small, request), small, config, 3),
            "No layout of 3 GPU(s) can be planned: every one is excluded, each with its reason "
            "below.");
}

// The dry run of LLaMA-7B's step at TP 4 counts the design's volumes per token and block (both
// passes): full 2·2d; vanilla 5d + 2d_ff forward, 3d + d_ff backward (the grouped projections'
// input gradients share one all-reduce); btp 7r + 2 forward (with the two online RMSNorm
// statistics) and 7r backward.
TEST(Planner, CountsTheDesignsVolumesAtLlama7bScale) {
  const double d = 4096, dff = 11008, r = 1024;
  const ClusterSpec cluster = load_cluster("a100-perlmutter");
  for (const auto& [mode, bottleneck, expected] :
       {std::tuple{"full", "none", 2 * 2 * d},
        std::tuple{"vanilla", "cola", 5 * d + 2 * dff + 3 * d + dff},
        std::tuple{"btp", "cola", 7 * r + 2 + 7 * r}}) {
    SCOPED_TRACE(mode);
    const TrainConfig config = parse_train_config_string(fmt::format(R"([model]
vocab_size = 32000
hidden_size = 4096
intermediate_size = 11008
num_layers = 32
num_heads = 32
bottleneck = "{}"
rank = 1024
max_seq_len = 4096
[training]
micro_batch_size = 4
seq_len = 4096
precision = "bf16"
[parallel]
tp = 4
tp_mode = "{}"
)",
                                                                     bottleneck, mode),
                                                         "7b.toml");
    const Prediction p = predict(config, cluster);
    ASSERT_TRUE(p.excluded.empty()) << p.excluded;
    EXPECT_EQ(p.tp_elements_per_token_block, expected);
    EXPECT_GT(p.step, p.peak_bound);
    EXPECT_GT(p.mfu, 0.2);
    EXPECT_LT(p.mfu, 0.8);
  }
}

constexpr const char* kConfig = R"([model]
vocab_size = 64
hidden_size = 64
intermediate_size = 128
num_layers = 4
num_heads = 4
bottleneck = "cola"
rank = 16
max_seq_len = 32

[training]
micro_batch_size = 2
seq_len = 32

[parallel]
tp = 2
)";

// What bench tp counts per block is what the dry run counts, for each of its three modes.
TEST(PlanCli, VolumesEqualBenchTpCounters) {
  TempDir dir;
  write_file(dir / "c.toml", kConfig);
  const auto bench = run(fmt::format("{} {} bench tp {} --json --steps 1 --warmup 0", mpirun(2),
                                     bottle_binary(), (dir / "c.toml")));
  ASSERT_EQ(bench.status, 0) << bench.output;
  // In the precision bench tp ran in: plan would otherwise take the cluster's bf16.
  const auto plan = run(fmt::format(
      "{} plan {} --cluster a100-perlmutter --tp 2 --json --set training.precision=fp32",
      bottle_binary(), (dir / "c.toml")));
  ASSERT_EQ(plan.status, 0) << plan.output;
  std::map<std::string, nlohmann::json> planned;
  std::istringstream lines(plan.output);
  for (std::string line; std::getline(lines, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("step_s") && j.at("recompute") == "none" && j.at("micro_batch_size") == 2)
      planned[j.at("tp_mode").get<std::string>()] = j;
  }
  int modes = 0;
  std::istringstream rows(bench.output);
  for (std::string line; std::getline(rows, line);) {
    if (line.empty() || line[0] != '{') continue;
    const auto b = nlohmann::json::parse(line);
    const std::string mode = b.at("mode");
    SCOPED_TRACE(mode);
    ASSERT_TRUE(planned.count(mode));
    const nlohmann::json& p = planned[mode];
    EXPECT_EQ(p.at("tp_elements_per_token_block").get<double>(),
              b.at("fwd_elems_per_token_block").get<double>() +
                  b.at("bwd_elems_per_token_block").get<double>());
    EXPECT_EQ(p.at("tp_calls_per_block").get<double>(),
              b.at("collectives_per_block").get<double>() +
                  b.at("bwd_collectives_per_block").get<double>());
    EXPECT_EQ(p.at("memory_bytes").get<double>(),
              b.at("peak_bytes").get<double>() -
                  b.at("memory_per_rank").at("workspace")[0].get<double>() +
                  p.at("workspace_bytes").get<double>());
    ++modes;
  }
  EXPECT_EQ(modes, 3);
}

TEST(PlanCli, RanksLayoutsAndExplainsExclusions) {
  TempDir dir;
  write_file(dir / "c.toml", kConfig);
  const auto r = run(fmt::format("{} plan {} --cluster h100 --gpus 4 --global-batch 8 --all",
                                 bottle_binary(), (dir / "c.toml")));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("btp tp2 pp1 dp2"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("full (full-rank model) tp4 pp1 dp1"), std::string::npos);
  // The cluster's native precision unless told, the best layout of each mode first, and rows
  // a terminal can show.
  EXPECT_NE(r.output.find("precision: bf16 (the cluster's native one"), std::string::npos)
      << r.output;
  const size_t best = r.output.find("best per TP mode:"),
               every = r.output.find("every layout, fastest first:");
  ASSERT_NE(best, std::string::npos) << r.output;
  ASSERT_NE(every, std::string::npos) << r.output;
  const std::string summary = r.output.substr(best, every - best);
  for (const char* mode : {"\n  1    ", " btp tp", " vanilla tp", " full (full-rank model) tp"})
    EXPECT_NE(summary.find(mode), std::string::npos) << mode << " in\n" << summary;
  std::istringstream lines(r.output);
  for (std::string line; std::getline(lines, line);) EXPECT_LE(line.size(), 180u) << line;
  const auto fp32 =
      run(fmt::format("{} plan {} --cluster h100 --gpus 4 --global-batch 8 --set "
                      "training.precision=fp32",
                      bottle_binary(), (dir / "c.toml")));
  EXPECT_NE(fp32.output.find("precision: fp32\n"), std::string::npos) << fp32.output;
  // On 3 GPUs nothing of this model splits 3 ways: one exclusion per TP mode, saying why.
  const auto odd = run(fmt::format("{} plan {} --cluster h100 --gpus 3 --global-batch 3 --all",
                                   bottle_binary(), (dir / "c.toml")));
  ASSERT_EQ(odd.status, 0) << odd.output;
  EXPECT_NE(odd.output.find("excluded ("), std::string::npos) << odd.output;
  EXPECT_NE(odd.output.find("tp3 pp1 dp1"), std::string::npos);
  EXPECT_NE(odd.output.find("parallel.tp (3) must divide"), std::string::npos) << odd.output;
  EXPECT_NE(odd.output.find("excluded (3)"), std::string::npos) << odd.output;
  // Issue 57: where nothing fits, a sentence says so and why, before the rows.
  std::string tiny = cluster_to_toml(load_cluster("h100"), "tiny");
  tiny.replace(tiny.find("memory_gib = 80.0"), 17, "memory_gib = 1e-5");
  write_file(dir / "tiny.toml", tiny);
  const auto none = run(fmt::format("{} plan {} --cluster {} --gpus 4 --global-batch 8",
                                    bottle_binary(), (dir / "c.toml"), (dir / "tiny.toml")));
  ASSERT_EQ(none.status, 0) << none.output;
  const size_t said = none.output.find("No layout fits the 1e-05 GiB of a NVIDIA H100");
  EXPECT_NE(said, std::string::npos) << none.output;
  EXPECT_LT(said, none.output.find("  #    layout")) << none.output;
  EXPECT_EQ(r.output.find("No layout"), std::string::npos) << r.output;
  // With --json, the sentence is the first line's object; every other line is a layout.
  const auto none_json = run(fmt::format("{} plan {} --cluster {} --gpus 4 --global-batch 8 --json",
                                         bottle_binary(), (dir / "c.toml"), (dir / "tiny.toml")));
  ASSERT_EQ(none_json.status, 0) << none_json.output;
  std::istringstream json_lines(none_json.output);
  std::string first;
  std::getline(json_lines, first);
  const nlohmann::json head = nlohmann::json::parse(first);
  ASSERT_TRUE(head.contains("nothing_fits")) << first;
  EXPECT_TRUE(head.at("nothing_fits").get<std::string>().starts_with("No layout fits the 1e-05"))
      << first;
  int layouts = 0, sentences = 0;
  for (std::string line; std::getline(json_lines, line);)
    ++(nlohmann::json::parse(line).contains("layout") ? layouts : sentences);
  EXPECT_GT(layouts, 0);
  EXPECT_EQ(sentences, 0) << none_json.output;
}

TEST(PlanCli, BadInputGetsOneClearError) {
  TempDir dir;
  write_file(dir / "c.toml", kConfig);
  std::string broken = cluster_to_toml(load_cluster("a100-perlmutter"), "broken");
  broken.erase(broken.find("memory_bandwidth_gbs"),
               broken.find('\n', broken.find("memory_bandwidth_gbs")) -
                   broken.find("memory_bandwidth_gbs") + 1);
  write_file(dir / "broken.toml", broken);
  std::string slow = cluster_to_toml(load_cluster("h100"), "slow");
  slow.replace(slow.find("kernel_overhead_us = 0.0"), 24, "kernel_overhead_us = 1e308");
  write_file(dir / "slow.toml", slow);
  const std::string config = (dir / "c.toml");
  const std::vector<std::pair<std::string, std::string>> cases{
      {fmt::format("plan {} --cluster a300", config),
       "--cluster 'a300' is neither a preset (a100-perlmutter, h100, h200) nor a cluster file"},
      {fmt::format("plan {} --cluster {}", config, (dir / "broken.toml")),
       "broken.toml: key 'gpu.memory_bandwidth_gbs' is missing"},
      {fmt::format("plan {} --cluster h100 --gpus 6 --tp 4", config),
       "plan: --tp 4 does not divide the 6 GPUs"},
      {fmt::format("plan {} --cluster h100 --gpus 8 --tp 2 --pp 3", config),
       "plan: --tp 2 × --pp 3 = 6 does not divide the 8 GPUs"},
      {fmt::format("plan {}", config), "plan: --cluster is required"},
      {fmt::format("plan {} --cluster h100 --set data.train=x", config),
       "plan does not read key 'data.train'"},
      {fmt::format("plan --calibrate {}", (dir / "here.toml")),
       "plan --calibrate measures the collectives between ranks: run it under mpirun"},
      // Issue 57: no infinite prices (this printed -nan and inf rows, and exited 0), and no
      // plan of a billion blocks (which ran out of memory).
      {fmt::format("plan {} --cluster {}", config, (dir / "slow.toml")),
       "slow.toml: key 'gpu.kernel_overhead_us' must be in [0, 1e+06] (µs), got 1e+308"},
      {fmt::format("plan {} --cluster h100 --set model.num_layers=1000000000", config),
       "model.num_layers = 1000000000: bottle plan plans at most 1024 blocks"},
  };
  for (const auto& [args, expected] : cases) {
    SCOPED_TRACE(args);
    const auto r = run(fmt::format("{} {}", bottle_binary(), args));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(r.output.rfind("bottle: error: ", 0), 0u) << r.output;
    EXPECT_NE(r.output.find(expected), std::string::npos) << r.output;
    EXPECT_EQ(testing::count_occurrences(r.output, "error:"), 1) << r.output;
  }
}

// --calibrate writes a cluster file of this machine that plan reads back.
TEST(PlanCli, CalibrateWritesAClusterFileOfThisMachine) {
  TempDir dir;
  const std::string file = dir / "here.toml";
  const auto r = run(fmt::format("{} {} plan --calibrate {}", mpirun(2), bottle_binary(), file));
  ASSERT_EQ(r.status, 0) << r.output;
  const ClusterSpec here = load_cluster(file);
  EXPECT_EQ(here.gpus_per_node, 2);
  EXPECT_GT(here.fp32_tflops, 0);
  EXPECT_GT(here.attention_tflops, 0);
  EXPECT_GT(here.intra_node.bandwidth_gbs, 0);
  EXPECT_EQ(here.gemm_efficiency, 1.0);
  // Measured and read back, in its range: how much GEMMs lose beside the ranks' transfers
  // depends on the cores free (over shared memory on two cores, most of their speed).
  EXPECT_GE(here.overlap_compute_slowdown, 0);
  EXPECT_LE(here.overlap_compute_slowdown, 99);
  std::stringstream text;
  text << std::ifstream(file).rdbuf();
  EXPECT_NE(text.str().find("[overlap]\ncompute_slowdown = "), std::string::npos);
  write_file(dir / "c.toml", kConfig);
  const auto plan =
      run(fmt::format("{} plan {} --cluster {} --tp 2", bottle_binary(), (dir / "c.toml"), file));
  EXPECT_EQ(plan.status, 0) << plan.output;
  EXPECT_NE(plan.output.find("btp tp2 pp1 dp1"), std::string::npos) << plan.output;
}

// The paper's runs, predicted: every table's rows, each mode planned.
TEST(PlanCli, PredictsThePapersRuns) {
  const auto r = run(fmt::format("{} plan --paper --json", bottle_binary()));
  ASSERT_EQ(r.status, 0) << r.output;
  const auto j = nlohmann::json::parse(r.output);
  ASSERT_EQ(j.at("iteration").size(), 6u);
  EXPECT_EQ(j.at("microbatch").size(), 4u);
  EXPECT_EQ(j.at("kinds").size(), 3u);
  EXPECT_EQ(j.at("collectives").size(), 3u);
  for (const auto& row : j.at("iteration"))
    for (const char* mode : {"full", "vanilla", "btp"}) {
      SCOPED_TRACE(row.at("model").get<std::string>() + " " + mode);
      EXPECT_GT(row.at(mode).at("step_s").get<double>(),
                row.at(mode).at("peak_bound_s").get<double>());
    }
  const auto md = run(fmt::format("{} plan --paper", bottle_binary()));
  ASSERT_EQ(md.status, 0) << md.output;
  EXPECT_NE(md.output.find("## Predicted on the paper's cluster"), std::string::npos);
}

}  // namespace
}  // namespace bottle
