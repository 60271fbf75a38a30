#pragma once
// The benches' results as typed records, each written to and read from JSON in this one place:
// `bench tp --json`'s row per mode and variant, `bench tp --fit --json`'s row per mode and
// policy, `bench norm --json`'s row and `bench step --json`'s row per kind and precision.
// The JSON keeps the keys and values the benches have always printed (tools/ and the tests
// parse them; tools/same_bits.sh compares them). Reading a row that lacks a key fails naming
// the key: a missing figure is an error, never a NaN that a report prints as "n/a".
#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/arena.h"
#include "core/statistics.h"

namespace bottle {

// One tensor-parallel component's times per step (--components): compute and all-reduce, ms.
struct TpComponentTimes {
  std::string name;  // as the mode's layout names it (TpLayout::components): "qkv", "gate_up"
  Spread compute_ms, comm_ms;
};

// `bench tp --json`: one mode and variant's step, volumes, times and memory on one TP group.
struct TpRow {
  std::string mode;     // full, vanilla, btp
  std::string variant;  // "btp ungrouped", "vanilla recompute=block", ...
  bool grouping = true;
  std::string model;  // the bottleneck kind the mode ran ("none" for full)
  int tp = 1;
  std::string recompute;  // the policy's name
  bool tp_overlap = false;
  std::string tp_backward;  // parallel.tp_backward: "async" or "serial"
  std::string precision;
  // Per block (and per token and block) of one step, the mode's block call sites.
  double fwd_elems_per_block = 0, bwd_elems_per_block = 0;
  double fwd_elems_per_token_block = 0, bwd_elems_per_token_block = 0;
  double fwd_bytes_per_token_block = 0, bwd_bytes_per_token_block = 0;
  double collectives_per_block = 0, bwd_collectives_per_block = 0;
  double recompute_collectives = 0, recompute_elems_per_block = 0;
  // The optimizer's collectives in one step (Muon's), and their share of the step's TP
  // elements.
  double optimizer_elements = 0, optimizer_collectives = 0, optimizer_share = 0;
  double fwd_comm_ms_per_block = 0, bwd_comm_ms_per_block = 0;
  // Medians over the recorded steps (the spreads below give min and max).
  double comm_exposed_ms = 0, compute_ms = 0, tokens_per_s = 0;
  size_t peak_bytes = 0, weights_bytes = 0, gradients_bytes = 0, optimizer_bytes = 0;
  size_t activation_bytes = 0, buffer_bytes = 0;
  // Against the same variant keeping every activation (0 without recomputation).
  double saved_mb = 0, extra_ms = 0, saved_mb_per_ms = 0;
  // Every rank's bytes, [tag][rank], tags in MemoryTag's order.
  std::array<std::vector<size_t>, size_t(MemoryTag::count)> memory_per_rank;
  Spread iter_ms, comm_ms, recompute_ms;
  Spread block_comm_ms_per_pass;  // the mode's block collectives per block and pass
  // --components only: in the layout's order; empty without it.
  std::vector<TpComponentTimes> components;
  // --components only: each call site's ms per step, and what the step waited for of it.
  std::optional<std::map<std::string, double>> comm_ms_by_site, comm_exposed_ms_by_site;

  // The component `name`; fails naming the key when the row has none (run without
  // --components).
  const TpComponentTimes& component(const std::string& name) const;
};

// `bench tp --fit --json`: the largest micro-batch a mode and policy plan under a limit.
struct FitRow {
  int64_t fit_limit_bytes = 0;
  std::string mode, recompute;
  int64_t tp = 1, seq_len = 0;
  int64_t max_micro_batch = 0;  // 0: not even micro-batch 1 fits (bytes then at 1)
  int64_t tried_up_to = 0;
  size_t weights_bytes = 0, gradients_bytes = 0, optimizer_bytes = 0;
  size_t activation_and_buffer_bytes = 0, total_bytes = 0;  // the largest rank's
};

// `bench norm --json`: online RMSNorm on t ranks against RMSNorm on one.
struct NormRow {
  int tp = 1;
  int64_t rows = 0, hidden = 0, rank = 0;
  std::string backend;
  double max_abs_diff = 0, mean_abs_diff = 0, bwd_max_abs_diff = 0, bwd_mean_abs_diff = 0;
};

// `bench step --json`: one model kind's training step in one precision, with the PyTorch
// peer's columns where it ran and the kernels' profile with --profile. An optional member is a
// key the row holds only on some backends or with some flags, written where it always was.
struct StepRow {
  std::string kind, precision, backend;
  std::string optimizer = "adamw";  // optimizer.name
  Spread optimizer_ms;              // optimizer_ms_per_step, _min, _max: the update inside the step
  // Another optimizer's row against AdamW's of the same kind and precision: its step time over
  // AdamW's (step_vs_adamw).
  std::optional<double> step_vs_adamw;
  int64_t rank = 0;  // the bottleneck's rank of q (0: the full-rank model)
  int64_t params = 0;
  Spread ms;  // ms_per_step, ms_min, ms_max
  double tokens_per_s = 0, gflops = 0;
  std::optional<double> mfu;  // null: above the measured peak, or the peak measured while busy
  double gemm_peak_gflops = 0;
  // --peak-tflops: MFU against it (mfu_nominal), and it (nominal_peak_tflops).
  struct Nominal {
    double mfu = 0, peak_tflops = 0;
  };
  std::optional<Nominal> nominal;
  std::optional<std::string> device;  // backend_names()'s line, on a backend other than cpu
  std::string attention, cpu, onednn_isa;
  std::optional<double> host_waits_per_step;  // on a device
  double loss = 0, grad_norm = 0, lr = 0;     // the last timed step's
  size_t peak_bytes = 0;
  std::optional<std::string> bf16_gemm_path;   // in bf16
  std::optional<double> speedup_vs_full_rank;  // a bottleneck kind in the first precision
  // In a precision after the first, against the first: its name ("fp32" writes the key
  // speedup_vs_fp32) and the speedup.
  std::optional<std::pair<std::string, double>> speedup_vs_precision;
  std::optional<std::string> torch_error;  // the peer failed on a device: the error's first line
  // The PyTorch peer's columns; absent when the peer did not run (--torch false, or it
  // failed on a device).
  struct Peer {
    Spread ms;  // torch_ms_per_step, torch_ms_min, torch_ms_max
    std::string version, blas_core, blas_core_source, blas_core_pinned;
    std::optional<std::string> blas_fallback;                  // why the pinned core ran after all
    double first_loss = 0, first_grad_norm = 0;                // the peer's first step
    double bottle_first_loss = 0, bottle_first_grad_norm = 0;  // first_loss, first_grad_norm
    std::string device, dtype, attention;
    std::optional<std::string> gpu;  // on cuda
    double speedup_vs_torch = 0;
  };
  std::optional<Peer> peer;
  // --torch-compile, when it compiled: torch_compile_ms_*, speedup_vs_torch_compile.
  struct Compiled {
    Spread ms;
    double speedup = 0;
  };
  std::optional<Compiled> compiled;
  // --torch-compile, when it failed: torch_compile_failed (true) and torch_compile_error.
  // `raised`: the peer's run failed (the error's key comes first) rather than reporting that
  // compiling failed (the flag's key comes first); only an ordered row tells them apart.
  struct CompileFailure {
    std::string error;
    bool raised = false;
  };
  std::optional<CompileFailure> compile_failure;
  // --profile: backend ops (launches) and ms in them per step, attention's share, and each
  // op's calls and ms per step.
  struct OpTime {
    double calls = 0, ms = 0;
  };
  struct Profile {
    double ops_per_step = 0, kernel_ms_per_step = 0, attention_ms_per_step = 0;
    std::map<std::string, OpTime> ops;
  };
  std::optional<Profile> profile;
};

nlohmann::ordered_json to_json(const TpRow& row);
nlohmann::ordered_json to_json(const FitRow& row);
nlohmann::ordered_json to_json(const NormRow& row);
nlohmann::ordered_json to_json(const StepRow& row);

// Each fails naming the key a row lacks or holds with the wrong type; `what` names the row's
// source in the message ("bench paper: 'tp2'").
TpRow tp_row_from_json(const nlohmann::json& j, const std::string& what);
FitRow fit_row_from_json(const nlohmann::json& j, const std::string& what);
NormRow norm_row_from_json(const nlohmann::json& j, const std::string& what);
StepRow step_row_from_json(const nlohmann::json& j, const std::string& what);
// The same from a row that kept its keys' order: the one way to tell CompileFailure::raised.
StepRow step_row_from_json(const nlohmann::ordered_json& j, const std::string& what);

}  // namespace bottle
