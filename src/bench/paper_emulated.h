#pragma once
// The paper's iteration-time rows run on an emulated GPU cluster: what
// tools/cluster/bench_emulated.sh --paper measured and `bottle plan` predicted for each row,
// read back from its result.json files for `bench paper --emulated` (docs/design.md §24).
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace bottle {

struct EmulatedMode {
  double measured_ms = 0;                    // the median iteration (or step) measured
  double predicted_ms = 0;                   // bottle plan on the cluster file of the run
  std::optional<double> predicted_after_ms;  // on the links measured again after the run
};

struct EmulatedRow {
  std::string file;       // the result.json it was read from
  std::string model;      // the paper's model it scales ("7B")
  std::string kind;       // "bench_tp" (TP in one node) or "train" (with PP or DP)
  std::string layout;     // as bench_emulated.sh names it: NxR, or TPxPPxDP
  std::string preset;     // the emulated cluster ("a100-perlmutter")
  std::string precision;  // fp32 or bf16
  std::string config;     // the scaled model's configuration
  int tp = 1, pp = 1, dp = 1;
  double k = 0;  // time dilation: one second of the GPU's work takes k here
  std::map<std::string, EmulatedMode> modes;  // full, vanilla, btp

  // `over`'s time over btp's (measured or predicted); nullopt when a mode is missing.
  std::optional<double> speedup(const std::string& over, bool predicted) const;
};

// Every DIR/paper_*/result.json, by model in the paper's order (then by folder); fails
// naming the file and the key when one is unreadable or lacks a key, and when none is found.
std::vector<EmulatedRow> read_emulated_rows(const std::filesystem::path& dir,
                                            const std::vector<std::string>& paper_models);

nlohmann::json to_json(const EmulatedRow& row);

}  // namespace bottle
