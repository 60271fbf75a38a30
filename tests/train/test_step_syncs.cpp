// A training step makes the host wait for the device once: where it reads the step's loss and
// gradient norm (docs/design.md §9). Counted without a GPU by bottle plan's dry run, whose
// counting backend counts every op a device backend would wait in (Backend::host_waits:
// synchronize, to_host, first_outside, sum, sum_squares), over every layout that changes the
// step's reductions: TP modes and groups, pipelines with their tied embedding, data parallelism
// with and without ZeRO-1, accumulation, recomputation, bf16, clipping on and off.
#include <gtest/gtest.h>

#include <string>

#include "backend/counting_backend.h"
#include "plan/dry_run.h"
#include "train/train_config.h"

namespace bottle {
namespace {

struct Case {
  std::string name;
  std::string bottleneck;
  std::string training;   // extra lines of [training]
  std::string parallel;   // extra lines of [parallel]
  std::string optimizer;  // extra lines of [optimizer]
};

TrainConfig config_of(const Case& c) {
  return parse_train_config_string(R"([model]
vocab_size = 64
hidden_size = 32
intermediate_size = 64
num_layers = 4
num_heads = 4
num_kv_heads = 2
rank = 8
max_seq_len = 16
tie_embeddings = true
bottleneck = ")" + c.bottleneck + R"("
[training]
micro_batch_size = 2
seq_len = 16
)" + c.training + "\n[parallel]\n" + c.parallel +
                                       "\n[optimizer]\n" + c.optimizer + "\n",
                                   "step syncs test");
}

class StepSyncs : public ::testing::TestWithParam<Case> {};

TEST_P(StepSyncs, AtMostOneWaitPerStep) {
  const TrainConfig config = config_of(GetParam());
  for (int stage = 0; stage < int(config.parallel.pp); ++stage) {
    const StageCounts counts = dry_run_stage(config, stage);
    EXPECT_EQ(counts.host_waits, 1) << GetParam().name << ", stage " << stage;
    // None of the ops that return device data to the host runs inside the step but the one
    // read of its scalars.
    for (const auto& [phase, ops] : counts.ops)
      for (const char* k : {"first_outside", "sum", "sum_squares", "synchronize"})
        EXPECT_EQ(ops.kernels.count(k), 0u)
            << GetParam().name << ": " << k << " in '" << phase << "'";
  }
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, StepSyncs,
    ::testing::Values(
        Case{"cola_fp32", "cola", "", ""},
        Case{"none_bf16_clip", "none", "precision = \"bf16\"\nmax_norm = 0.5", ""},
        Case{"lax_accum_recompute", "lax", "grad_accum_steps = 3\nrecompute = \"lowrank\"", ""},
        Case{"btp_tp2", "cola", "", "tp = 2\ntp_mode = \"btp\""},
        Case{"vanilla_tp2", "svd", "", "tp = 2\ntp_mode = \"vanilla\""},
        Case{"full_tp2", "none", "", "tp = 2\ntp_mode = \"full\""},
        Case{"pp2_1f1b_tied", "cola", "grad_accum_steps = 4", "pp = 2\nschedule = \"1f1b\""},
        Case{"dp2", "cola", "", "dp = 2"},
        Case{"dp2_zero_bf16", "cola", "precision = \"bf16\"", "dp = 2\nzero = 1"},
        // ZeRO-2: every micro-batch's buckets folded into the shard on the device.
        Case{"dp2_zero2_accum", "cola", "grad_accum_steps = 3", "dp = 2\nzero = 2"},
        // ZeRO-3: every unit gathered and cast on the device, before each forward and backward.
        Case{"dp2_zero3_bf16_accum", "cola", "precision = \"bf16\"\ngrad_accum_steps = 3",
             "dp = 2\nzero = 3"},
        Case{"tp2_pp2_dp2", "cola", "grad_accum_steps = 2", "tp = 2\npp = 2\ndp = 2\nzero = 1"},
        // Muon: its norms, Gram all-reduces, gathers and ZeRO's exchanges stay on the device.
        Case{"muon_btp_tp2_bf16", "cola", "precision = \"bf16\"", "tp = 2\ntp_mode = \"btp\"",
             "name = \"muon\""},
        Case{"muon_vanilla_tp2", "svd", "", "tp = 2\ntp_mode = \"vanilla\"", "name = \"muon\""},
        Case{"muon_full_tp2_dp2_zero2", "none", "", "tp = 2\ntp_mode = \"full\"\ndp = 2\nzero = 2",
             "name = \"muon\""}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

}  // namespace
}  // namespace bottle
