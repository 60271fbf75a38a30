#include "train/plot.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// Removes the plot's scratch files however plot_metrics ends.
struct ScratchFiles {
  std::vector<fs::path> paths;
  ~ScratchFiles() {
    std::error_code ignored;
    for (const fs::path& p : paths) fs::remove(p, ignored);
  }
};

bool is_number(const nlohmann::json& j, const char* key) {
  return j.contains(key) && j[key].is_number();
}

}  // namespace

void plot_metrics(const std::string& jsonl_path, const std::string& png_path) {
  // A device (/dev/full, /dev/zero) or a FIFO would be read without end.
  std::error_code ec;
  BOTTLE_CHECK(fs::is_regular_file(jsonl_path, ec),
               "{}: the metrics to plot must be a regular file (not a device, FIFO or directory)",
               jsonl_path);
  std::ifstream in(jsonl_path);
  BOTTLE_CHECK(in, "{}: cannot open", jsonl_path);
  const fs::path out_dir = fs::path(png_path).parent_path();
  BOTTLE_CHECK(out_dir.empty() || fs::is_directory(out_dir), "{}: folder {} does not exist",
               png_path, out_dir.string());
  const fs::path train_dat = png_path + ".train.dat", val_dat = png_path + ".val.dat",
                 script = png_path + ".gp";
  // The plot and its scratch files replace what they name: never the metrics themselves.
  for (const fs::path& out : {fs::path(png_path), train_dat, val_dat, script}) {
    BOTTLE_CHECK(!fs::exists(out, ec) || fs::is_regular_file(out, ec),
                 "{}: the plot must be written to a regular file (not a device, FIFO or "
                 "directory)",
                 out.string());
    BOTTLE_CHECK(!fs::exists(out, ec) || !fs::equivalent(out, jsonl_path, ec),
                 "{}: the plot would overwrite the metrics it draws ({})", out.string(),
                 jsonl_path);
  }
  ScratchFiles scratch;
  scratch.paths = {train_dat, val_dat, script};
  std::ofstream train(train_dat), val(val_dat);
  int64_t rows = 0, val_rows = 0, line_no = 0;
  for (std::string line; std::getline(in, line);) {
    ++line_no;
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line, nullptr, false);
    BOTTLE_CHECK(!j.is_discarded() && j.is_object() && is_number(j, "step"),
                 "{}:{}: not a metrics line", jsonl_path, line_no);
    // A skipped step's non-finite loss is null in JSON: it has no point on the curve.
    if (is_number(j, "loss") && is_number(j, "lr")) {
      train << j["step"].get<int64_t>() << " " << j["loss"].get<double>() << " "
            << j["lr"].get<double>() << "\n";
      ++rows;
    }
    if (is_number(j, "val_loss")) {
      val << j["step"].get<int64_t>() << " " << j["val_loss"].get<double>() << "\n";
      ++val_rows;
    }
  }
  train.close();
  val.close();
  BOTTLE_CHECK(train && val, "{}: cannot write the plot's data beside it (disk full?)", png_path);
  BOTTLE_CHECK(rows > 0, "{}: no training steps to plot", jsonl_path);
  {
    std::ofstream gp(script);
    gp << "set terminal pngcairo size 1000,600 font 'sans,11'\n"
       << "set output '" << png_path << "'\n"
       << "set title 'bottle: " << fs::path(jsonl_path).filename().string() << "'\n"
       << "set xlabel 'step'\nset ylabel 'loss (nats)'\nset y2label 'learning rate'\n"
       << "set ytics nomirror\nset y2tics\nset grid\nset key top right\n"
       << "plot '" << train_dat.string() << "' using 1:2 with lines lw 1.5 title 'train loss'";
    if (val_rows > 0)
      gp << ", '" << val_dat.string() << "' using 1:2 with linespoints lw 2 pt 7 title 'val loss'";
    gp << ", '" << train_dat.string()
       << "' using 1:3 axes x1y2 with lines dt 2 lc rgb 'gray40' title 'lr'\n";
    gp.close();
    BOTTLE_CHECK(gp, "{}: cannot write the plot's script (disk full?)", script.string());
  }
  const int rc = std::system(fmt::format("gnuplot '{}' 2>&1", script.string()).c_str());
  BOTTLE_CHECK(rc == 0 && fs::exists(png_path),
               "{}: gnuplot failed to draw the plot (is gnuplot installed?)", png_path);
}

}  // namespace bottle
