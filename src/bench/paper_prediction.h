#pragma once
// The BOOST paper's runs predicted by `bottle plan` (plan/planner.h) on a cluster — the A100
// preset, the paper's machine — beside the paper's figures: `bench paper`'s section "Predicted
// on the paper's cluster" and `bottle plan --paper`.
#include <nlohmann/json.hpp>
#include <string>

#include "bench/paper_figures.h"
#include "plan/cluster.h"

namespace bottle {

// Every run of the paper's iteration-time, micro-batch, bottleneck-kind and per-block
// all-reduce tables, predicted: one JSON object per table, each row with the three modes'
// predictions (plan --json's fields).
nlohmann::json predict_paper_runs(const ClusterSpec& cluster);

// The predictions as a Markdown section, every cell beside the paper's figure (read from
// `paper`) with its error, the speedups likewise, and what explains the cells that miss.
std::string paper_prediction_markdown(const nlohmann::json& predicted, const PaperFigures& paper);

}  // namespace bottle
