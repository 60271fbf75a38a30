#pragma once
// The report of `bottle bench paper`: what its runs measured, as DIR/report.md with
// gnuplot PNGs next to it and DIR/results.json, each figure beside the paper's.
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/paper_emulated.h"
#include "bench/results.h"

namespace bottle {

struct PaperResults {
  std::string scale;  // "quick" or "full"
  nlohmann::json machine, settings;
  // `bench tp --json` rows (one per mode and variant) ...
  std::map<int, std::vector<TpRow>> tp;             // ... per TP degree (2: + recompute)
  std::map<int64_t, std::vector<TpRow>> batch;      // ... per micro-batch, TP 2
  std::map<std::string, std::vector<TpRow>> kinds;  // ... per bottleneck kind, TP 2
  std::map<int64_t, std::vector<TpRow>> grouping;   // ... --variants --components
  size_t memory_limit = 0;                          // of the micro-batch sweep, per rank
  bool memory_limit_default = true;
  std::vector<FitRow> fits;                 // `bench tp --fit` rows under memory_limit, TP 2
  std::vector<FitRow> fits_7b;              // the same for CoLA-7B's shape, TP 4, 80 GiB
  std::vector<NormRow> norm;                // `bench norm --json`, per backend
  std::vector<StepRow> torch;               // `bench step --json` rows (none, cola)
  std::map<int, std::vector<double>> loss;  // per TP degree, one per step
  // The paper's own runs predicted on its cluster (paper_prediction.h): no measurement.
  nlohmann::json predicted;
  // Its iteration-time rows scaled down and run on an emulated GPU cluster (--emulated).
  std::vector<EmulatedRow> emulated;
};

// Writes out/report.md, out/results.json and the plots; fails naming a plot gnuplot could
// not draw.
void write_paper_report(const PaperResults& results, const std::filesystem::path& out);

}  // namespace bottle
