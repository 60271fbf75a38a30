// The benches' result records (bench/results.h): each written to JSON and read back is the same
// row, and a row that lacks a key is refused naming the key.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "bench/results.h"
#include "core/error.h"
#include "parallel/tp_layout.h"
#include "parallel/tp_layouts.h"

namespace bottle {
namespace {

using json = nlohmann::json;
using ordered = nlohmann::ordered_json;

// Every member away from its default, so that a member read back wrong shows.
TpRow sample_tp_row(bool optional_members) {
  TpRow r;
  r.mode = "btp";
  r.variant = "btp ungrouped";
  r.grouping = false;
  r.model = "cola";
  r.tp = 2;
  r.recompute = "lowrank";
  r.tp_overlap = true;
  r.tp_backward = "serial";
  r.optimizer_elements = 17976, r.optimizer_collectives = 6, r.optimizer_share = 0.5;
  r.precision = "bf16";
  r.fwd_elems_per_block = 1.5, r.bwd_elems_per_block = 2.5;
  r.fwd_elems_per_token_block = 3.5, r.bwd_elems_per_token_block = 4.5;
  r.fwd_bytes_per_token_block = 5.5, r.bwd_bytes_per_token_block = 6.5;
  r.collectives_per_block = 7, r.bwd_collectives_per_block = 8;
  r.recompute_collectives = 9, r.recompute_elems_per_block = 10.25;
  r.fwd_comm_ms_per_block = 11.125, r.bwd_comm_ms_per_block = 12.0625;
  r.comm_exposed_ms = 13.5, r.compute_ms = 14.5, r.tokens_per_s = 15000.75;
  r.peak_bytes = 16, r.weights_bytes = 17, r.gradients_bytes = 18, r.optimizer_bytes = 19;
  r.activation_bytes = 20, r.buffer_bytes = 21;
  r.saved_mb = 22.5, r.extra_ms = 23.5, r.saved_mb_per_ms = 24.5;
  for (size_t tag = 0; tag < r.memory_per_rank.size(); ++tag)
    r.memory_per_rank[tag] = {100 + tag, 200 + tag};
  r.iter_ms = {30, 29, 31.5};
  r.comm_ms = {3, 2.5, 3.5};
  r.recompute_ms = {1, 0.5, 1.5};
  r.block_comm_ms_per_pass = {0.25, 0.125, 0.375};
  if (optional_members) {
    const TpLayout* layout = find_tp_layout("btp");
    EXPECT_NE(layout, nullptr);
    double ms = 1;
    for (const TpComponent& c : layout->components()) {
      r.components.push_back(
          {std::string(c.name), {ms, ms - 0.5, ms + 0.5}, {ms + 1, ms + 0.5, ms + 1.5}});
      ms += 2;
    }
    EXPECT_FALSE(r.components.empty());
    r.comm_ms_by_site = std::map<std::string, double>{{"attn.out", 1.25}, {"mlp.down", 2.5}};
    r.comm_exposed_ms_by_site = std::map<std::string, double>{{"attn.out", 0.5}, {"mlp.down", 1}};
  }
  return r;
}

FitRow sample_fit_row() {
  FitRow r;
  r.fit_limit_bytes = int64_t(80) << 30;
  r.mode = "vanilla";
  r.recompute = "block";
  r.tp = 4, r.seq_len = 4096, r.max_micro_batch = 6, r.tried_up_to = 7;
  r.weights_bytes = 1, r.gradients_bytes = 2, r.optimizer_bytes = 3;
  r.activation_and_buffer_bytes = 4, r.total_bytes = 10;
  return r;
}

NormRow sample_norm_row() {
  NormRow r;
  r.tp = 2, r.rows = 512, r.hidden = 256, r.rank = 64;
  r.backend = "reference";
  r.max_abs_diff = 1e-6, r.mean_abs_diff = 2e-7, r.bwd_max_abs_diff = 3e-6;
  r.bwd_mean_abs_diff = 4e-7;
  return r;
}

StepRow sample_step_row(bool optional_members, bool compile_raised = false) {
  StepRow r;
  r.kind = "cola", r.precision = "bf16", r.backend = "cuda";
  r.optimizer = "muon", r.optimizer_ms = {3.5, 3.25, 4.5};
  r.rank = 64, r.params = 123456789;
  r.ms = {10.5, 10, 11.25};
  r.tokens_per_s = 9876.5, r.gflops = 321.5;
  r.gemm_peak_gflops = 900.25;
  r.attention = "cudnn", r.cpu = "Some CPU", r.onednn_isa = "avx512";
  r.loss = 5.5, r.grad_norm = 1.25, r.lr = double(1e-3f);
  r.peak_bytes = size_t(1) << 33;
  if (!optional_members) return r;  // mfu null: no MFU
  r.step_vs_adamw = 1.125;
  r.mfu = 0.375;
  r.nominal = StepRow::Nominal{0.125, 989};
  r.device = "cuda: CUDA runtime 13.0";
  r.host_waits_per_step = 2.5;
  r.bf16_gemm_path = "cublasLt";
  r.speedup_vs_full_rank = 1.75;
  r.speedup_vs_precision = {"fp32", 2.25};
  r.torch_error = "the peer's first line";
  StepRow::Peer& p = r.peer.emplace();
  p.ms = {20.5, 20, 21};
  p.version = "2.5.0", p.blas_core = "Zen", p.blas_core_source = "detected";
  p.blas_core_pinned = "Haswell";
  p.blas_fallback = "OpenBLAS Zen over the pinned Haswell: ...";
  p.first_loss = 5.625, p.first_grad_norm = 1.5;
  p.bottle_first_loss = 5.5, p.bottle_first_grad_norm = 1.25;
  p.device = "cuda", p.dtype = "autocast-bf16", p.attention = "sdpa", p.gpu = "H100";
  p.speedup_vs_torch = 1.95;
  r.compiled = StepRow::Compiled{{15, 14.5, 15.5}, 1.4};
  r.compile_failure = StepRow::CompileFailure{"compile: no triton", compile_raised};
  r.profile = StepRow::Profile{12, 9.5, 2.25, {{"attention_fwd", {2, 1.5}}, {"gemm", {10, 8}}}};
  return r;
}

// Read back as the bench paper launcher reads a child's line: parsed, so unordered.
template <typename Row, typename Read>
void expect_round_trip(const Row& row, Read read) {
  const ordered written = to_json(row);
  const Row back = read(json::parse(written.dump()), "test row");
  EXPECT_EQ(to_json(back).dump(), written.dump());
}

// Each key of `row`'s JSON, taken away, is refused naming that key.
template <typename Row, typename Read>
void expect_each_key_required(const Row& row, Read read) {
  const json whole = json(to_json(row));
  ASSERT_FALSE(whole.empty());
  for (const auto& [key, value] : whole.items()) {
    json lacking = whole;
    lacking.erase(key);
    try {
      read(lacking, "test row");
      ADD_FAILURE() << "a row without '" << key << "' was read";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("'" + key + "'"), std::string::npos)
          << "without '" << key << "': " << e.what();
    }
  }
}

StepRow read_step(const json& j, const std::string& what) { return step_row_from_json(j, what); }

TEST(BenchResults, TpRowRoundTrip) {
  expect_round_trip(sample_tp_row(false), tp_row_from_json);
  expect_round_trip(sample_tp_row(true), tp_row_from_json);
}

TEST(BenchResults, TpRowRefusesAMissingKey) {
  expect_each_key_required(sample_tp_row(false), tp_row_from_json);
}

TEST(BenchResults, FitRow) {
  expect_round_trip(sample_fit_row(), fit_row_from_json);
  expect_each_key_required(sample_fit_row(), fit_row_from_json);
}

TEST(BenchResults, NormRow) {
  expect_round_trip(sample_norm_row(), norm_row_from_json);
  expect_each_key_required(sample_norm_row(), norm_row_from_json);
}

TEST(BenchResults, StepRowRoundTrip) {
  expect_round_trip(sample_step_row(false), read_step);
  expect_round_trip(sample_step_row(true), read_step);
  EXPECT_TRUE(json(to_json(sample_step_row(false))).at("mfu").is_null());
}

// A failed torch.compile writes its two keys in the order the failure came about; only a row
// that kept its order tells which.
TEST(BenchResults, StepRowKeepsTheCompileFailuresOrder) {
  for (const bool raised : {false, true}) {
    const StepRow row = sample_step_row(true, raised);
    const ordered written = to_json(row);
    const StepRow back = step_row_from_json(ordered::parse(written.dump()), "test row");
    EXPECT_EQ(to_json(back).dump(), written.dump());
    ASSERT_TRUE(back.compile_failure);
    EXPECT_EQ(back.compile_failure->raised, raised);
  }
}

TEST(BenchResults, StepRowRefusesAMissingKey) {
  expect_each_key_required(sample_step_row(false), read_step);
}

TEST(BenchResults, StepRowRefusesAPartOfAGroup) {
  // The peer's columns come together: one of them missing is refused, naming it.
  json j = json(to_json(sample_step_row(true)));
  j.erase("torch_blas_core");
  try {
    step_row_from_json(j, "test row");
    ADD_FAILURE() << "a peer without torch_blas_core was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'torch_blas_core'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace bottle
