#pragma once
// Plots with gnuplot (Debian gnuplot-nox), for `train` (metrics.plot, `bottle plot`) and the
// report of `bench paper`. gnuplot runs without a shell: its script is a file passed as one
// argument, and every path inside the script is a gnuplot string literal, so no path is ever
// read as a command. Errors name the plot.
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

// `text` as a gnuplot single-quoted string: quotes doubled, nothing else is special inside
// one. Fails naming `text` as `what` when it holds a line break or a NUL, which no gnuplot
// string can hold.
std::string gnuplot_string(std::string_view text, std::string_view what);

// The absolute form of `path` as a gnuplot string. Absolute, because gnuplot reads a file
// name that begins with '<' (a data file) or '|' (the output) as a shell command.
std::string gnuplot_path(const std::filesystem::path& path);

// The first lines of a script that draws `png` (width × height pixels) with the pngcairo
// terminal.
std::string gnuplot_png_preamble(const std::filesystem::path& png, int width, int height);

// Runs gnuplot on the script file `script`, which draws `png`. Fails naming `png` when gnuplot
// is not on PATH, fails or writes no image; gnuplot's own messages are in the error.
void run_gnuplot(const std::filesystem::path& script, const std::filesystem::path& png);

// Draws training loss, validation loss and learning rate against step from a metrics.jsonl
// into a PNG. Its data and script are scratch files beside the PNG (PNG.train.dat,
// PNG.val.dat, PNG.gp), removed when it ends. Errors name the file.
void plot_metrics(const std::string& jsonl_path, const std::string& png_path);
// Several runs in one PNG (e.g. fp32 and bf16 from the same seed): each run's losses, named
// after its folder, and the first run's learning rate. Scratch files PNG.<i>.train.dat etc.
void plot_metrics(const std::vector<std::string>& jsonl_paths, const std::string& png_path);

}  // namespace bottle
