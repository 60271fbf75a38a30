// The TOML training configuration: defaults, a full file, every error class naming its
// key, --set overrides, the to_toml round trip and the files in configs/; and the two error
// macros (BOTTLE_CHECK for a user's input, BOTTLE_ASSERT for an internal invariant).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "parallel/tp_layouts.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;

TrainConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_train_config_string(text, "test.toml", overrides);
}

// The message of the bottle::Error thrown by parsing `text` with `overrides`.
std::string error_of(const std::string& text, const std::vector<std::string>& overrides = {}) {
  try {
    parse(text, overrides);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for:\n" << text;
  return {};
}

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << (haystack)

// The two failure macros: BOTTLE_CHECK's message is the user's sentence alone; BOTTLE_ASSERT's
// says it is an internal error and where, from the repository's src/ or tests/ on.
TEST(ErrorMacros, AssertNamesFileAndLine) {
  const int line = __LINE__ + 2;
  try {
    BOTTLE_ASSERT(1 + 1 == 3, "two is {}", 1 + 1);
    ADD_FAILURE() << "BOTTLE_ASSERT did not throw";
  } catch (const InternalError& e) {
    const std::string where = fmt::format("tests/train/test_train_config.cpp:{}", line);
    EXPECT_EQ(std::string(e.what()), "internal error at " + where + ": two is 2");
    EXPECT_EQ(e.where(), where);
    EXPECT_EQ(e.message(), "two is 2");
  }
  // An assertion is a bottle::Error, so every path that reports one reports it.
  EXPECT_THROW(BOTTLE_ASSERT(false, "broken"), Error);
  EXPECT_NO_THROW(BOTTLE_ASSERT(true, "never"));
  try {
    BOTTLE_CHECK(false, "{}: missing key '{}'", "run.toml", "model");
    ADD_FAILURE() << "BOTTLE_CHECK did not throw";
  } catch (const InternalError&) {
    ADD_FAILURE() << "BOTTLE_CHECK is for a user's input, not an internal error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "run.toml: missing key 'model'");
  }
  EXPECT_EQ(source_path("/home/me/src/bottle/src/nn/linear.cpp"), "src/nn/linear.cpp");
  EXPECT_EQ(source_path("/x/bottle/tests/train/test_train.cpp"), "tests/train/test_train.cpp");
  EXPECT_EQ(source_path("linear.cpp"), "linear.cpp");
}

TEST(TrainConfig, Defaults) {
  const TrainConfig c = parse("");
  const ModelConfig m;
  EXPECT_EQ(c.model.hidden_size, m.hidden_size);
  EXPECT_EQ(c.model.num_kv_heads, c.model.num_heads);
  EXPECT_EQ(c.model.bottleneck, BottleneckKind::none);
  EXPECT_EQ(c.model.rank, 0);
  EXPECT_FALSE(c.model.mlp_gate_act.has_value());
  EXPECT_EQ(c.training.steps, 1000);
  EXPECT_EQ(c.training.micro_batch_size, 8);
  EXPECT_EQ(c.training.seq_len, 256);
  EXPECT_EQ(c.training.grad_accum_steps, 1);
  EXPECT_EQ(c.training.seed, 1234);
  EXPECT_DOUBLE_EQ(c.training.max_norm, 1.0);
  EXPECT_EQ(c.training.recompute, Recompute::none);
  EXPECT_EQ(c.training.precision, Precision::fp32);
  EXPECT_EQ(c.training.on_nonfinite, OnNonfinite::stop);
  EXPECT_EQ(c.training.eval_interval, 100);
  EXPECT_EQ(c.training.eval_batches, 8);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 3e-4);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 0.1);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.9);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.95);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-8);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 0);
  EXPECT_EQ(c.lr_scheduler.decay, LrDecay::cosine);
  EXPECT_DOUBLE_EQ(c.lr_scheduler.min_lr_ratio, 0.1);
  EXPECT_TRUE(c.data.train.empty());
  EXPECT_EQ(c.data.val, "");
  EXPECT_EQ(c.checkpoint.folder, "checkpoints");
  EXPECT_EQ(c.checkpoint.interval, 0);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.metrics.log_freq, 1);
  EXPECT_EQ(c.metrics.jsonl, "metrics.jsonl");
  EXPECT_EQ(c.metrics.plot, "loss.png");
  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_EQ(c.parallel.tp_mode, &tp_layout("full"));
  EXPECT_EQ(c.parallel.schedule, PipelineSchedule::one_f_one_b);
  EXPECT_EQ(c.parallel.zero, 0);
  EXPECT_TRUE(c.parallel.grouping);
  // The struct's defaults, with the one that depends on the model (tp_mode) resolved.
  TrainConfig defaults;
  defaults.parallel.tp_mode = &default_tp_layout(defaults.model.shape());
  EXPECT_EQ(c, defaults);
  const AdamWConfig a = c.adamw();
  EXPECT_FLOAT_EQ(a.lr, 3e-4f);
  EXPECT_FLOAT_EQ(a.beta2, 0.95f);
  EXPECT_FLOAT_EQ(a.weight_decay, 0.1f);
}

const char* kFullFile = R"(
# every section
[model]
vocab_size = 512
hidden_size = 128
intermediate_size = 352
num_layers = 2
num_heads = 4
num_kv_heads = 2
bottleneck = "lax"
rank = 32
ranks = { q = 16, down = 24 }
tie_embeddings = true
rms_norm_eps = 1e-6
rope_theta = 500000        # an integer for a float key
max_seq_len = 512
mlp_gate_act = true

[training]
steps = 50
micro_batch_size = 4
seq_len = 128
grad_accum_steps = 2
seed = 7
max_norm = 0
recompute = "block"
memory_limit = "20GiB"
precision = "bf16"
on_nonfinite = "skip"
eval_interval = 0
eval_batches = 3

[optimizer]
lr = 2e-3
weight_decay = 0.0
beta1 = 0.8
beta2 = 0.99
eps = 1e-6

[lr_scheduler]
warmup_steps = 5
decay = "linear"
min_lr_ratio = 0.0

[data]
train = "data/x/train_*.bin"
val = "data/x/val.bin"

[checkpoint]
folder = "runs/x"
interval = 10
keep = 1

[metrics]
log_freq = 5
jsonl = "m.jsonl"
plot = ""

[parallel]
tp = 2
pp = 2
dp = 1
tp_mode = "vanilla"
schedule = "gpipe"
zero = 1
grouping = false
)";

TEST(TrainConfig, FullFile) {
  const TrainConfig c = parse(kFullFile);
  EXPECT_EQ(c.model.vocab_size, 512);
  EXPECT_EQ(c.model.hidden_size, 128);
  EXPECT_EQ(c.model.intermediate_size, 352);
  EXPECT_EQ(c.model.num_layers, 2);
  EXPECT_EQ(c.model.num_heads, 4);
  EXPECT_EQ(c.model.num_kv_heads, 2);
  EXPECT_EQ(c.model.bottleneck, BottleneckKind::lax);
  EXPECT_EQ(c.model.rank, 32);
  EXPECT_EQ(c.model.rank_of(ProjectionId::q), 16);
  EXPECT_EQ(c.model.rank_of(ProjectionId::down), 24);
  EXPECT_EQ(c.model.rank_of(ProjectionId::k), 32);
  EXPECT_TRUE(c.model.tie_embeddings);
  EXPECT_FLOAT_EQ(c.model.rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(c.model.rope_theta, 500000.0f);
  EXPECT_EQ(c.model.max_seq_len, 512);
  EXPECT_EQ(c.model.mlp_gate_act, std::optional<bool>(true));
  EXPECT_EQ(c.training.steps, 50);
  EXPECT_EQ(c.training.micro_batch_size, 4);
  EXPECT_EQ(c.training.seq_len, 128);
  EXPECT_EQ(c.training.grad_accum_steps, 2);
  EXPECT_EQ(c.training.seed, 7);
  EXPECT_EQ(c.training.max_norm, 0.0);
  EXPECT_EQ(c.training.recompute, Recompute::block);
  EXPECT_EQ(c.training.memory_limit, int64_t(20) << 30);
  EXPECT_EQ(c.training.precision, Precision::bf16);
  EXPECT_EQ(c.training.on_nonfinite, OnNonfinite::skip);
  EXPECT_EQ(c.training.eval_interval, 0);
  EXPECT_EQ(c.training.eval_batches, 3);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 2e-3);
  EXPECT_EQ(c.optimizer.weight_decay, 0.0);
  EXPECT_DOUBLE_EQ(c.optimizer.beta1, 0.8);
  EXPECT_DOUBLE_EQ(c.optimizer.beta2, 0.99);
  EXPECT_DOUBLE_EQ(c.optimizer.eps, 1e-6);
  EXPECT_EQ(c.lr_scheduler.warmup_steps, 5);
  EXPECT_EQ(c.lr_scheduler.decay, LrDecay::linear);
  EXPECT_EQ(c.lr_scheduler.min_lr_ratio, 0.0);
  EXPECT_EQ(c.data.train, std::vector<std::string>{"data/x/train_*.bin"});
  EXPECT_EQ(c.data.val, "data/x/val.bin");
  EXPECT_EQ(c.checkpoint.folder, "runs/x");
  EXPECT_EQ(c.checkpoint.interval, 10);
  EXPECT_EQ(c.checkpoint.keep, 1);
  EXPECT_EQ(c.metrics.log_freq, 5);
  EXPECT_EQ(c.metrics.jsonl, "m.jsonl");
  EXPECT_EQ(c.metrics.plot, "");
  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.pp, 2);
  EXPECT_EQ(c.parallel.dp, 1);
  EXPECT_EQ(c.parallel.tp_mode, &tp_layout("vanilla"));
  EXPECT_EQ(c.parallel.schedule, PipelineSchedule::gpipe);
  EXPECT_EQ(c.parallel.zero, 1);
  EXPECT_FALSE(c.parallel.grouping);
  EXPECT_EQ(c.tokens_per_step(), 4 * 128 * 2);
  // The ranks also as a [model.ranks] table.
  const TrainConfig t = parse("[model]\nbottleneck = \"cola\"\n[model.ranks]\nv = 8\n");
  EXPECT_EQ(t.model.rank_of(ProjectionId::v), 8);
}

TEST(TrainConfig, ResolvedDefaults) {
  // tp_mode: full for a full-rank model, btp for a bottleneck model, unless given.
  EXPECT_EQ(parse("[model]\nbottleneck = \"cola\"").parallel.tp_mode, &tp_layout("btp"));
  EXPECT_EQ(parse("[model]\nbottleneck = \"none\"").parallel.tp_mode, &tp_layout("full"));
  EXPECT_EQ(parse("", {"model.bottleneck=svd"}).parallel.tp_mode, &tp_layout("btp"));
  EXPECT_EQ(
      parse("[model]\nbottleneck = \"cola\"\n[parallel]\ntp_mode = \"vanilla\"").parallel.tp_mode,
      &tp_layout("vanilla"));
  // num_kv_heads follows num_heads unless given, also when num_heads comes from --set.
  EXPECT_EQ(parse("[model]\nnum_heads = 4").model.num_kv_heads, 4);
  EXPECT_EQ(parse("", {"model.num_heads=2"}).model.num_kv_heads, 2);
  EXPECT_EQ(parse("[model]\nnum_kv_heads = 2").model.num_kv_heads, 2);
}

TEST(TrainConfig, ParseErrorNamesFileLineAndColumn) {
  const std::string e = error_of("[training]\nsteps = = 3\n");
  EXPECT_CONTAINS(e, "test.toml");
  EXPECT_CONTAINS(e, "line 2");
  EXPECT_CONTAINS(e, "column");
}

TEST(TrainConfig, UnknownKeys) {
  EXPECT_EQ(error_of("[training]\nstep = 3\n"),
            "test.toml: unknown key 'training.step' (did you mean 'training.steps'?)");
  EXPECT_EQ(error_of("[trainig]\nsteps = 3\n"),
            "test.toml: unknown key 'trainig.steps' (did you mean 'training.steps'?)");
  // The right key in the wrong section.
  EXPECT_EQ(error_of("[optimizer]\nwarmup_steps = 3\n"),
            "test.toml: unknown key 'optimizer.warmup_steps' (did you mean "
            "'lr_scheduler.warmup_steps'?)");
  EXPECT_EQ(error_of("[banana]\nsplit = 3\n"), "test.toml: unknown key 'banana.split'");
  EXPECT_EQ(error_of("[banana]\n"), "test.toml: unknown key 'banana'");
  EXPECT_CONTAINS(error_of("top = 1\n"), "unknown key 'top'");
  EXPECT_CONTAINS(error_of("[model]\nranks = { x = 3 }\n"), "unknown key 'model.ranks.x'");
  // The first unknown key in the file is the one reported.
  EXPECT_CONTAINS(error_of("[training]\nzzz = 1\naaa = 2\n"), "'training.zzz'");
}

TEST(TrainConfig, WrongTypes) {
  EXPECT_EQ(error_of("[training]\nsteps = \"ten\"\n"),
            "test.toml: key 'training.steps' must be an integer, got string");
  EXPECT_EQ(error_of("[training]\nsteps = 1.5\n"),
            "test.toml: key 'training.steps' must be an integer, got float");
  EXPECT_EQ(error_of("[optimizer]\nlr = \"fast\"\n"),
            "test.toml: key 'optimizer.lr' must be a number, got string");
  EXPECT_EQ(error_of("[parallel]\ngrouping = 1\n"),
            "test.toml: key 'parallel.grouping' must be a boolean, got integer");
  EXPECT_EQ(error_of("[data]\ntrain = 3\n"),
            "test.toml: key 'data.train' must be a string or an array of strings, got integer");
  EXPECT_EQ(error_of("[training]\nprecision = [1]\n"),
            "test.toml: key 'training.precision' must be a string, got array");
  EXPECT_EQ(error_of("[model]\nranks = 4\n"),
            "test.toml: key 'model.ranks' must be a table, got integer");
  EXPECT_EQ(error_of("training = 4\n"), "test.toml: key 'training' must be a table, got integer");
  EXPECT_CONTAINS(error_of("[training.steps]\nx = 1\n"), "'training.steps' must be an integer");
}

TEST(TrainConfig, OutOfRange) {
  EXPECT_EQ(error_of("[optimizer]\nlr = -1\n"),
            "test.toml: key 'optimizer.lr' must be > 0, got -1");
  EXPECT_EQ(error_of("[training]\nsteps = 0\n"),
            "test.toml: key 'training.steps' must be > 0, got 0");
  EXPECT_EQ(error_of("[training]\nseed = -2\n"),
            "test.toml: key 'training.seed' must be >= 0, got -2");
  EXPECT_EQ(error_of("[optimizer]\nbeta2 = 1.0\n"),
            "test.toml: key 'optimizer.beta2' must be in [0, 1), got 1");
  EXPECT_EQ(error_of("[lr_scheduler]\nmin_lr_ratio = 1.5\n"),
            "test.toml: key 'lr_scheduler.min_lr_ratio' must be in [0, 1], got 1.5");
  EXPECT_EQ(error_of("[checkpoint]\nkeep = 0\n"),
            "test.toml: key 'checkpoint.keep' must be >= 1, got 0");
  EXPECT_EQ(error_of("[parallel]\nzero = 4\n"),
            "test.toml: key 'parallel.zero' must be in [0, 3], got 4");
  EXPECT_CONTAINS(error_of("[parallel]\ntp = 9999999999\n"), "'parallel.tp'");
  EXPECT_CONTAINS(error_of("[optimizer]\nlr = nan\n"), "'optimizer.lr' must be > 0");
  EXPECT_CONTAINS(error_of("[optimizer]\nlr = inf\n"), "'optimizer.lr'");
  EXPECT_EQ(error_of("[model]\nrank = 0\n"), "test.toml: key 'model.rank' must be > 0, got 0");
  EXPECT_EQ(error_of("[model]\nranks = { q = -3 }\n"),
            "test.toml: key 'model.ranks.q' must be > 0, got -3");
}

TEST(TrainConfig, BadEnumListsChoices) {
  EXPECT_EQ(error_of("[training]\nprecision = \"fp16\"\n"),
            "test.toml: key 'training.precision' must be one of \"fp32\", \"bf16\"; got \"fp16\"");
  const std::string e = error_of("[model]\nbottleneck = \"lora\"\n");
  EXPECT_CONTAINS(e, "'model.bottleneck'");
  EXPECT_CONTAINS(e, "\"none\", \"svd\", \"cola\", \"lax\"");
  EXPECT_CONTAINS(error_of("[parallel]\nschedule = \"zb\"\n"), "\"1f1b\", \"gpipe\"");
}

TEST(TrainConfig, CrossFieldValidation) {
  EXPECT_EQ(error_of("[training]\nseq_len = 2048\n"),
            "test.toml: key 'training.seq_len' must be <= model.max_seq_len (1024), got 2048");
  EXPECT_CONTAINS(error_of("[model]\nhidden_size = 100\nnum_heads = 8\n"), "model.num_heads");
  EXPECT_CONTAINS(error_of("[model]\nnum_heads = 8\nnum_kv_heads = 3\n"), "model.num_kv_heads");
  EXPECT_CONTAINS(error_of("[model]\nbottleneck = \"cola\"\nrank = 9999\n"), "model.rank");
  EXPECT_CONTAINS(error_of("[parallel]\ntp_mode = \"btp\"\n"), "'parallel.tp_mode'");
  EXPECT_CONTAINS(error_of("[model]\nbottleneck = \"cola\"\n[parallel]\ntp_mode = \"full\"\n"),
                  "'parallel.tp_mode'");
  EXPECT_CONTAINS(error_of("[parallel]\ntp = 3\n"), "'parallel.tp'");
  EXPECT_CONTAINS(error_of("[parallel]\npp = 5\n"), "'parallel.pp'");
  // Cross-field errors from --set name the file too (the key is what matters).
  EXPECT_CONTAINS(error_of("", {"training.seq_len=4096"}), "training.seq_len");
  // TP overlap halves each micro-batch by its sequences; LaX's latents cross a stage boundary
  // whole, which the halves do not keep.
  EXPECT_FALSE(parse("").parallel.tp_overlap);
  EXPECT_TRUE(parse("[parallel]\ntp_overlap = true\n").parallel.tp_overlap);
  EXPECT_EQ(error_of("[training]\nmicro_batch_size = 3\n[parallel]\ntp_overlap = true\n"),
            "test.toml: key 'parallel.tp_overlap' splits each micro-batch into two halves of its "
            "sequences: it needs an even training.micro_batch_size, not 3");
  EXPECT_CONTAINS(error_of("[model]\nbottleneck = \"lax\"\nrank = 64\nnum_layers = 4\n"
                           "[parallel]\ntp_overlap = true\npp = 2\n"),
                  "key 'parallel.tp_overlap' does not run LaX over a pipeline");
}

// parallel.schedule takes the registry's names and parallel.virtual_stages its chunks: > 1
// only with, and needed by, interleaved_1f1b. The model runs chunk 0 and BW only, so the
// schedules needing chunks or a split W pass are refused by name (schedule_unrunnable).
TEST(TrainConfig, PipelineScheduleAndVirtualStages) {
  EXPECT_EQ(parse("").parallel.virtual_stages, 1);
  EXPECT_EQ(parse("[parallel]\nschedule = \"gpipe\"\npp = 2\n").parallel.schedule,
            PipelineSchedule::gpipe);
  EXPECT_CONTAINS(error_of("[parallel]\nschedule = \"zb\"\n"),
                  "\"1f1b\", \"gpipe\", \"interleaved_1f1b\", \"zb_h1\"");
  EXPECT_CONTAINS(error_of("[parallel]\nvirtual_stages = 0\n"), "'parallel.virtual_stages'");
  EXPECT_EQ(error_of("[parallel]\nvirtual_stages = 2\npp = 2\n"),
            "test.toml: key 'parallel.virtual_stages' = 2 needs parallel.schedule = "
            "\"interleaved_1f1b\"; \"1f1b\" runs one chunk per stage");
  EXPECT_EQ(error_of("[parallel]\nschedule = \"interleaved_1f1b\"\npp = 2\n"),
            "test.toml: key 'parallel.schedule' = \"interleaved_1f1b\" interleaves model chunks: "
            "it needs parallel.virtual_stages >= 2, not 1");
  EXPECT_EQ(error_of("[training]\ngrad_accum_steps = 3\n"
                     "[parallel]\nschedule = \"interleaved_1f1b\"\npp = 2\nvirtual_stages = 2\n"),
            "test.toml: key 'training.grad_accum_steps' = 3 with parallel.schedule = "
            "\"interleaved_1f1b\" and parallel.pp = 2: interleaved_1f1b runs micro-batches in "
            "groups of one per stage: 3 micro-batches do not split into groups of 2 stages");
  EXPECT_EQ(error_of("[training]\ngrad_accum_steps = 4\n"
                     "[parallel]\nschedule = \"interleaved_1f1b\"\npp = 2\nvirtual_stages = 2\n"),
            "test.toml: key 'parallel.schedule' = \"interleaved_1f1b\": the model does not yet run "
            "several chunks per stage, which interleaved_1f1b interleaves");
  // zb_h1 runs (B and W passes), but not beside what its deferred W cannot read.
  EXPECT_NO_THROW(parse("[parallel]\nschedule = \"zb_h1\"\npp = 2\n"));
  EXPECT_EQ(error_of("[training]\nrecompute = \"block\"\n[parallel]\nschedule = \"zb_h1\"\n"
                     "pp = 2\n"),
            "test.toml: key 'parallel.schedule' = \"zb_h1\" needs training.recompute = \"none\": "
            "W reads the kept activations");
  EXPECT_EQ(error_of("[parallel]\nschedule = \"zb_h1\"\n"),
            "test.toml: key 'parallel.schedule' = \"zb_h1\" needs parallel.pp >= 2: one stage "
            "has no bubble to fill");
  // The one rule: what the model runs.
  for (const ScheduleInfo& info : schedules())
    EXPECT_EQ(schedule_runnable(info.id), !info.needs_virtual_stages) << info.name;
}

// training.attention: auto by default; "cudnn" is cuDNN's SDPA on the GPU, so a host backend
// refuses it by the key's name.
TEST(TrainConfig, AttentionChoice) {
  EXPECT_EQ(parse("").training.attention, AttentionChoice::automatic);
  EXPECT_EQ(parse("[training]\nattention = \"own\"\n").training.attention, AttentionChoice::own);
  EXPECT_EQ(parse("[training]\nbackend = \"cuda\"\nattention = \"cudnn\"\n").training.attention,
            AttentionChoice::cudnn);
  EXPECT_EQ(parse("", {"training.backend=cuda", "training.attention=cudnn"}).training.attention,
            AttentionChoice::cudnn);
  EXPECT_EQ(error_of("[training]\nattention = \"cudnn\"\n"),
            "test.toml: key 'training.attention' = \"cudnn\" is cuDNN's attention on the GPU: it "
            "needs training.backend = \"cuda\", not \"cpu\" (choose \"auto\" or \"own\")");
  EXPECT_CONTAINS(error_of("", {"training.backend=reference", "training.attention=cudnn"}),
                  "key 'training.attention' = \"cudnn\"");
  EXPECT_EQ(error_of("[training]\nattention = \"flash\"\n"),
            "test.toml: key 'training.attention' must be one of \"auto\", \"cudnn\", \"own\"; "
            "got \"flash\"");
  EXPECT_CONTAINS(describe_config_keys(), "  training.attention ");
  EXPECT_CONTAINS(to_toml(parse("", {"training.attention=own"})), "attention = \"own\"");
}

TEST(TrainConfig, MemoryLimitTakesBytesOrUnits) {
  EXPECT_EQ(parse("[training]\nmemory_limit = 1000\n").training.memory_limit, 1000);
  EXPECT_EQ(parse("", {"training.memory_limit=512MB"}).training.memory_limit, 512000000);
  EXPECT_EQ(parse("", {"training.memory_limit=\"1.5 KiB\""}).training.memory_limit, 1536);
  EXPECT_EQ(parse("", {"training.memory_limit=2TiB"}).training.memory_limit, int64_t(2) << 40);
  EXPECT_EQ(parse("").training.memory_limit, 0);  // no limit
  const std::string expected = "must be a byte size (an integer, or a string such as \"20GiB\")";
  EXPECT_CONTAINS(error_of("[training]\nmemory_limit = \"20XB\"\n"),
                  "test.toml: key 'training.memory_limit' " + expected);
  EXPECT_CONTAINS(error_of("[training]\nmemory_limit = -5\n"), expected);
  EXPECT_CONTAINS(error_of("[training]\nmemory_limit = 1.5\n"), expected);
  EXPECT_CONTAINS(error_of("", {"training.memory_limit=GiB"}), expected);
  EXPECT_CONTAINS(error_of("", {"training.memory_limit=1.5"}), expected);  // bytes are whole
}

TEST(TrainConfig, RecomputeMustFitTheMode) {
  EXPECT_EQ(
      error_of("[model]\nbottleneck = \"cola\"\n[parallel]\ntp_mode = \"vanilla\"\n"
               "[training]\nrecompute = \"lowrank\"\n"),
      "test.toml: key 'training.recompute' = \"lowrank\" needs parallel.tp_mode = \"btp\" (the "
      "default for a bottleneck model, on one rank too): under \"vanilla\" the chunk "
      "boundaries are full-width and rebuilding them re-runs all-reduces; use \"block\"");
  EXPECT_CONTAINS(error_of("[training]\nrecompute = \"lowrank\"\n"),
                  "but model.bottleneck is \"none\"");
  // A full-rank checkpoint says LlamaForCausalLM, whose MLP has SiLU on the gate.
  EXPECT_CONTAINS(error_of("[model]\nmlp_gate_act = false\n"),
                  "test.toml: model.mlp_gate_act = false needs a bottleneck");
  EXPECT_EQ(parse("[training]\nrecompute = \"block\"\n").training.recompute, Recompute::block);
}

TEST(TrainConfig, SetOverrides) {
  const TrainConfig c = parse(kFullFile, {
                                             "training.steps=77",
                                             "optimizer.lr=1e-3",
                                             "optimizer.weight_decay=1",  // an int for a float
                                             "parallel.grouping=true",
                                             "data.train=\"a b.bin\"",
                                             "data.val=plain/path.bin",
                                             "checkpoint.folder='single'",
                                             "training.precision=fp32",
                                             "model.ranks.q=8",
                                             "model.mlp_gate_act=false",
                                             " metrics.log_freq = 1_000 ",
                                         });
  EXPECT_EQ(c.training.steps, 77);
  EXPECT_DOUBLE_EQ(c.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(c.optimizer.weight_decay, 1.0);
  EXPECT_TRUE(c.parallel.grouping);
  EXPECT_EQ(c.data.train, std::vector<std::string>{"a b.bin"});
  EXPECT_EQ(c.data.val, "plain/path.bin");
  EXPECT_EQ(c.checkpoint.folder, "single");
  EXPECT_EQ(c.training.precision, Precision::fp32);
  EXPECT_EQ(c.model.rank_of(ProjectionId::q), 8);
  EXPECT_EQ(c.model.mlp_gate_act, std::optional<bool>(false));
  EXPECT_EQ(c.metrics.log_freq, 1000);
  // Later overrides win.
  EXPECT_EQ(parse("", {"training.steps=5", "training.steps=6"}).training.steps, 6);
  // btp's RMSNorm statistic: from the latent unless told, and what the model is built with.
  EXPECT_EQ(parse("").parallel.norm_statistic, NormStatistic::from_latent);
  const TrainConfig all_reduce = parse("", {"parallel.norm_statistic=\"all_reduce\""});
  EXPECT_EQ(all_reduce.parallel.norm_statistic, NormStatistic::all_reduce);
  EXPECT_EQ(tensor_parallel_of(all_reduce, nullptr).norm_backward, NormStatistic::all_reduce);
  EXPECT_EQ(error_of("", {"parallel.norm_statistic=\"both\""}),
            "--set: key 'parallel.norm_statistic' must be one of \"latent\", \"all_reduce\"; "
            "got \"both\"");
}

TEST(TrainConfig, SetErrors) {
  EXPECT_EQ(error_of("", {"training.stepz=3"}),
            "--set: unknown key 'training.stepz' (did you mean 'training.steps'?)");
  EXPECT_EQ(error_of("", {"x.y=1"}), "--set: unknown key 'x.y'");
  EXPECT_CONTAINS(error_of("", {"training.steps"}), "malformed override 'training.steps'");
  EXPECT_CONTAINS(error_of("", {"=3"}), "malformed override '=3'");
  EXPECT_EQ(error_of("", {"training.steps=ten"}),
            "--set: key 'training.steps' must be an integer, got 'ten'");
  EXPECT_EQ(error_of("", {"optimizer.lr=fast"}),
            "--set: key 'optimizer.lr' must be a number, got 'fast'");
  EXPECT_EQ(error_of("", {"parallel.grouping=yes"}),
            "--set: key 'parallel.grouping' must be a boolean, got 'yes'");
  EXPECT_EQ(error_of("", {"optimizer.lr=-1"}), "--set: key 'optimizer.lr' must be > 0, got -1");
  EXPECT_CONTAINS(error_of("", {"parallel.tp_mode=megatron"}), "'parallel.tp_mode' must be one of");
  EXPECT_CONTAINS(error_of("", {"model.ranks=4"}), "'model.ranks' is a table");
}

// data.train: one path as a string (as before mixtures), several as an array, weighed by
// data.weights; both from the file and from --set, written back the same way.
TEST(TrainConfig, DataTrainTakesSeveralSources) {
  const TrainConfig one = parse("[data]\ntrain = \"a.bin\"\n");
  EXPECT_EQ(one.data.train, std::vector<std::string>{"a.bin"});
  EXPECT_TRUE(one.data.weights.empty());
  EXPECT_CONTAINS(to_toml(one), "train = \"a.bin\"\n");
  EXPECT_CONTAINS(to_toml(one), "# weights: unset (default: each source's size");
  EXPECT_TRUE(parse("[data]\ntrain = \"\"\n").data.train.empty());
  const TrainConfig mix = parse("[data]\ntrain = [\"web/\", \"code/*.bin\"]\nweights = [3, 1.5]\n");
  EXPECT_EQ(mix.data.train, (std::vector<std::string>{"web/", "code/*.bin"}));
  EXPECT_EQ(mix.data.weights, (std::vector<double>{3.0, 1.5}));
  EXPECT_CONTAINS(to_toml(mix), "train = [\"web/\", \"code/*.bin\"]\nweights = [3.0, 1.5]\n");
  const TrainConfig again = parse_train_config_string(to_toml(mix), "again.toml");
  EXPECT_TRUE(again == mix) << config_difference(again, mix);
  // --set: a TOML array, or one bare path.
  const TrainConfig set = parse("", {"data.train=[\"x.bin\", 'y.bin']", "data.weights=[1, 2]"});
  EXPECT_EQ(set.data.train, (std::vector<std::string>{"x.bin", "y.bin"}));
  EXPECT_EQ(set.data.weights, (std::vector<double>{1.0, 2.0}));
  EXPECT_EQ(parse("", {"data.train=plain.bin"}).data.train, std::vector<std::string>{"plain.bin"});
  // Every error names the key and says what to give.
  EXPECT_EQ(error_of("[data]\ntrain = [\"a\", 3]\n"),
            "test.toml: key 'data.train' must be a string or an array of strings; item 2 is "
            "integer");
  EXPECT_EQ(error_of("[data]\ntrain = [\"a\", \"\"]\n"),
            "test.toml: key 'data.train' lists an empty path");
  EXPECT_EQ(error_of("[data]\ntrain = [\"a\", \"b\", \"a\"]\n"),
            "test.toml: key 'data.train' lists \"a\" twice (sources 1 and 3); give a source more "
            "weight in data.weights instead");
  EXPECT_EQ(error_of("[data]\ntrain = [\"a\", \"b\"]\nweights = [1]\n"),
            "test.toml: key 'data.weights' holds 1 weight(s) for 2 data.train source(s); give one "
            "per source, in data.train's order");
  EXPECT_EQ(error_of("[data]\ntrain = [\"a\", \"b\"]\nweights = [1, 0]\n"),
            "test.toml: key 'data.weights' must hold numbers > 0, got 0");
  // Issue 45, case 7: one rule for a weight. A share that prints as 0.0 % is refused as a
  // weight of 0 is, and an empty list is no weights rather than "unset" (both were accepted).
  EXPECT_EQ(error_of("[data]\ntrain = [\"a\", \"b\"]\nweights = [1e-300, 1]\n"),
            "test.toml: key 'data.weights' gives source 1 (\"a\") a weight of 1e-300 in a total of "
            "1: a share of 1e-298 %, which prints as 0.0 %; give it a larger weight or remove the "
            "source");
  EXPECT_EQ(
      error_of("", {"data.train=[\"a\", \"b\"]", "data.weights=[1, 3000]"}),
      "test.toml: key 'data.weights' gives source 1 (\"a\") a weight of 1 in a total of 3001: a "
      "share of 0.033 %, which prints as 0.0 %; give it a larger weight or remove the "
      "source");
  EXPECT_EQ(parse("", {"data.train=[\"a\", \"b\"]", "data.weights=[1, 1999]"}).data.weights,
            (std::vector<double>{1.0, 1999.0}));
  for (const auto& [toml, set] : {std::pair<std::string, std::vector<std::string>>{
                                      "[data]\ntrain = [\"a\", \"b\"]\nweights = []\n", {}},
                                  {"", {"data.train=[\"a\", \"b\"]", "data.weights=[]"}}})
    EXPECT_CONTAINS(error_of(toml, set),
                    "key 'data.weights' is an empty list; give one weight per data.train source, "
                    "or omit the key");
  EXPECT_EQ(error_of("[data]\nweights = 1\n"),
            "test.toml: key 'data.weights' must be an array of numbers, got integer");
  EXPECT_EQ(error_of("[data]\nweights = [1, \"2\"]\n"),
            "test.toml: key 'data.weights' must be an array of numbers; item 2 is string");
  EXPECT_EQ(error_of("", {"data.weights=2"}),
            "--set: key 'data.weights' must be an array of numbers, got '2'");
  EXPECT_EQ(error_of("", {"data.train=[\"a\""}),
            "--set: key 'data.train' must be a string or an array of strings, got '[\"a\"'");
  EXPECT_CONTAINS(error_of("[data]\ntrain = [\"a\\u0001\"]\n"),
                  "key 'data.train' holds the control character 0x01 at offset 1");
}

TEST(TrainConfig, RoundTrip) {
  for (const TrainConfig& c :
       {parse(""), parse(kFullFile),
        parse(kFullFile,
              {"data.train=we\"ird\\path \u00e9x", "model.rms_norm_eps=3.3e-7", "optimizer.lr=0.1",
               "model.rope_theta=12345.678", "lr_scheduler.min_lr_ratio=1"}),
        parse("[model]\nbottleneck = \"cola\"\nrank = 16")}) {
    const std::string text = to_toml(c);
    const TrainConfig again = parse_train_config_string(text, "roundtrip.toml", {});
    EXPECT_EQ(config_difference(c, again), "") << text;
    EXPECT_TRUE(c == again);
    EXPECT_EQ(to_toml(again), text);
  }
  // The text holds every section; the unset optional keys are comments.
  const std::string text = to_toml(parse(""));
  for (const char* s : {"[model]", "[training]", "[optimizer]", "[lr_scheduler]", "[data]",
                        "[checkpoint]", "[metrics]", "[parallel]", "num_kv_heads = 8",
                        "tp_mode = \"full\"", "schedule = \"1f1b\"", "# mlp_gate_act"})
    EXPECT_CONTAINS(text, s);
  // A difference is named.
  TrainConfig a, b;
  b.training.steps = 5;
  EXPECT_EQ(config_difference(a, b), "training.steps: 1000 vs 5");
  EXPECT_FALSE(a == b);
}

// Issue 29, rule 6: a string key that is not UTF-8 or holds a control character is refused as
// it is read (file or --set), naming the key and the offset, before it could fail a run's end.
TEST(TrainConfig, StringsMustBeUtf8WithoutControlCharacters) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"checkpoint.folder=run\xff", "byte 0xff at offset 3"},
      {"checkpoint.folder=a\nb", "a line break at offset 1"},
      {"metrics.plot=x\r.png", "a line break at offset 1"},
      {"metrics.jsonl=m\x01.jsonl", "the control character 0x01 at offset 1"},
      {"data.train=\xc0\x80", "byte 0xc0 at offset 0"},
      {"data.val=v\xed\xa0\x80", "byte 0xed at offset 1"},
      {"data.tokenizer=t\xe2\x82", "byte 0xe2 at offset 1"},
  };
  for (const auto& [set, why] : cases) {
    const std::string e = error_of("", {set});
    EXPECT_NE(e.find("--set: key '" + set.substr(0, set.find('=')) + "' holds " + why),
              std::string::npos)
        << e;
  }
  // In the file too (TOML's escapes make a line break), and valid UTF-8 passes.
  EXPECT_NE(error_of("[checkpoint]\nfolder = \"a\\nb\"\n")
                .find("key 'checkpoint.folder' holds a line break"),
            std::string::npos);
  EXPECT_EQ(parse("", {"checkpoint.folder=r\u00e9sum\u00e9 \u4e2d"}).checkpoint.folder,
            "r\u00e9sum\u00e9 \u4e2d");
}

TEST(TrainConfig, DescribeKeys) {
  const std::string d = describe_config_keys();
  for (const char* key :
       {"model.vocab_size", "model.ranks.q", "model.mlp_gate_act", "training.steps",
        "training.on_nonfinite", "optimizer.eps", "lr_scheduler.min_lr_ratio", "data.val",
        "checkpoint.keep", "metrics.plot", "parallel.grouping"})
    EXPECT_CONTAINS(d, std::string("  ") + key + " ");
  EXPECT_CONTAINS(d, "training.steps = 1000");
  EXPECT_CONTAINS(d, "model.num_kv_heads  (integer, > 0; default: model.num_heads)");
  EXPECT_CONTAINS(d, "\"cosine\", \"linear\", \"constant\"");
}

TEST(TrainConfig, LoadFile) {
  const fs::path dir = fs::temp_directory_path() / "bottle_test_train_config";
  fs::create_directories(dir);
  const fs::path file = dir / "c.toml";
  std::ofstream(file) << "[training]\nsteps = 12\n";
  EXPECT_EQ(load_train_config(file.string(), {"training.seed=3"}).training.steps, 12);
  std::ofstream(file) << "[training]\nsteps = -12\n";
  try {
    load_train_config(file.string(), {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), file.string() + ": key 'training.steps' must be > 0, got -12");
  }
  EXPECT_THROW(load_train_config((dir / "missing.toml").string(), {}), Error);
  fs::remove_all(dir);
}

TEST(TrainConfig, EveryFileInConfigsParses) {
  const fs::path dir = fs::path(BOTTLE_SOURCE_DIR) / "configs";
  int count = 0;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.path().extension() != ".toml") continue;
    SCOPED_TRACE(entry.path().string());
    TrainConfig c;
    EXPECT_NO_THROW(c = load_train_config(entry.path().string(), {}));
    EXPECT_FALSE(c.data.train.empty());
    const TrainConfig again = parse_train_config_string(to_toml(c), "roundtrip.toml", {});
    EXPECT_EQ(config_difference(c, again), "");
    ++count;
  }
  EXPECT_GE(count, 6);
  const TrainConfig tiny = load_train_config((dir / "tiny.toml").string(), {});
  EXPECT_EQ(tiny.model.bottleneck, BottleneckKind::cola);
  EXPECT_EQ(tiny.model.rank, 32);
  EXPECT_EQ(tiny.parallel.tp_mode, &tp_layout("btp"));
}

}  // namespace
}  // namespace bottle
