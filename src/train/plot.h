#pragma once
#include <string>

namespace bottle {
// Draws training loss, validation loss and learning rate against step from a metrics.jsonl
// into a PNG, with gnuplot (Debian gnuplot-nox). Errors name the file.
void plot_metrics(const std::string& jsonl_path, const std::string& png_path);
}  // namespace bottle
