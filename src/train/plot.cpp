#include "train/plot.h"

#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "io/atomic_output.h"
#include "core/error.h"
#include "io/file_read.h"
#include "sys/subprocess.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

// The last `limit` bytes of what gnuplot said, without its closing line breaks.
std::string tail_of(std::string text, size_t limit) {
  if (text.size() > limit) text = "..." + text.substr(text.size() - limit);
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return text;
}

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

std::string gnuplot_string(std::string_view text, std::string_view what) {
  std::string quoted = "'";
  for (char c : text) {
    BOTTLE_CHECK(c != '\n' && c != '\r' && c != '\0',
                 "{}: {} holds a line break or NUL, which a gnuplot script cannot quote", text,
                 what);
    quoted += c == '\'' ? std::string("''") : std::string(1, c);
  }
  return quoted + "'";
}

std::string gnuplot_path(const fs::path& path) {
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  BOTTLE_CHECK(!ec, "{}: cannot make the path absolute for gnuplot: {}", path.string(),
               ec.message());
  return gnuplot_string(absolute.string(), "the path");
}

std::string gnuplot_png_preamble(const fs::path& png, int width, int height) {
  return fmt::format("set terminal pngcairo size {},{} font 'sans,11'\nset output {}\n", width,
                     height, gnuplot_path(png));
}

void run_gnuplot(const fs::path& script, const fs::path& png) {
  // Absolute, so that gnuplot never reads the script's name as an option.
  std::error_code ec;
  std::string script_arg = fs::absolute(script, ec).string();
  BOTTLE_CHECK(!ec, "{}: cannot draw the plot: no absolute path for its script {} ({})",
               png.string(), script.string(), ec.message());
  // In a process group of its own: a terminal's Ctrl-C or hang-up stop bottle's run (which
  // then ends cleanly, plot included) and not the gnuplot drawing its last plot. Its messages
  // are read back when it ends.
  const ProcessResult drawn = run_process(
      {.argv = {"gnuplot", script_arg}, .capture_stderr = true, .own_process_group = true});
  BOTTLE_CHECK(drawn.start_error != ENOENT,
               "{}: cannot draw the plot: gnuplot is not on PATH (Debian package gnuplot-nox)",
               png.string());
  BOTTLE_CHECK(drawn.started(), "{}: cannot draw the plot: gnuplot does not start ({})",
               png.string(), std::strerror(drawn.start_error));
  const int status = drawn.wait_status;
  const std::string said = tail_of(drawn.output, 2000);
  const std::string shown = said.empty() ? "" : ":\n" + said;
  if (WIFSIGNALED(status))
    fail("{}: gnuplot was killed by signal {} while drawing the plot (script {}){}", png.string(),
         WTERMSIG(status), script.string(), shown);
  BOTTLE_CHECK(drawn.succeeded(),
               "{}: gnuplot failed to draw the plot (exit status {}, script {}){}", png.string(),
               WEXITSTATUS(status), script.string(), shown);
  BOTTLE_CHECK(fs::is_regular_file(png, ec) && fs::file_size(png, ec) > 0 && !ec,
               "{}: gnuplot wrote no image (script {}){}", png.string(), script.string(), shown);
  // On a full disk cairo's writes fail without gnuplot failing: a PNG ends with its IEND chunk
  // (its 4 type bytes and their CRC), a cut one does not.
  static constexpr char kPngEnd[] = "IEND\xAE\x42\x60\x82";
  char tail[8] = {};
  std::ifstream in(png, std::ios::binary);
  in.seekg(-8, std::ios::end);
  in.read(tail, 8);
  BOTTLE_CHECK(in && std::memcmp(tail, kPngEnd, 8) == 0,
               "{}: gnuplot's image is cut short (disk full?); script {}{}", png.string(),
               script.string(), shown);
}

void plot_metrics(const std::string& jsonl_path, const std::string& png_path) {
  plot_metrics(std::vector<std::string>{jsonl_path}, png_path);
}

void plot_metrics(const std::vector<std::string>& jsonl_paths, const std::string& png_path) {
  BOTTLE_CHECK(!jsonl_paths.empty(), "{}: no metrics to plot", png_path);
  std::error_code ec;
  const fs::path out_dir = fs::path(png_path).parent_path();
  BOTTLE_CHECK(out_dir.empty() || fs::is_directory(out_dir), "{}: folder {} does not exist",
               png_path, out_dir.string());
  const size_t runs = jsonl_paths.size();
  const fs::path script = png_path + ".gp";
  std::vector<fs::path> outputs{fs::path(png_path), script};
  // Run i's data: PNG.train.dat and PNG.val.dat for one run, PNG.<i>.train.dat for several.
  auto data_file = [&](size_t i, const char* what) {
    return fs::path(runs == 1 ? fmt::format("{}.{}.dat", png_path, what)
                              : fmt::format("{}.{}.{}.dat", png_path, i, what));
  };
  for (size_t i = 0; i < runs; ++i)
    for (const char* what : {"train", "val"}) outputs.push_back(data_file(i, what));
  for (const std::string& jsonl_path : jsonl_paths) {
    // A device (/dev/full, /dev/zero) or a FIFO would be read without end.
    BOTTLE_CHECK(fs::is_regular_file(jsonl_path, ec),
                 "{}: the metrics to plot must be a regular file (not a device, FIFO or "
                 "directory)",
                 jsonl_path);
    // The plot and its scratch files replace what they name: never the metrics themselves.
    for (const fs::path& out : outputs) {
      BOTTLE_CHECK(!fs::exists(out, ec) || fs::is_regular_file(out, ec),
                   "{}: the plot must be written to a regular file (not a device, FIFO or "
                   "directory)",
                   out.string());
      BOTTLE_CHECK(!fs::exists(out, ec) || !fs::equivalent(out, jsonl_path, ec),
                   "{}: the plot would overwrite the metrics it draws ({})", out.string(),
                   jsonl_path);
    }
  }
  // Quoted before anything is written: a path gnuplot cannot read fails here, cleanly. With
  // several runs each curve is named after its run's folder.
  auto label = [&](size_t i) {
    const fs::path p(jsonl_paths[i]);
    return p.parent_path().filename().empty() ? p.filename().string()
                                              : p.parent_path().filename().string();
  };
  // gnuplot draws into the partial copy, renamed onto png_path once whole (atomic_output.h);
  // a path it cannot quote is named as the user gave it.
  gnuplot_path(png_path);
  const std::string png_in_script = gnuplot_png_preamble(partial_path(png_path), 1000, 600),
                    title = gnuplot_string(
                        runs == 1 ? "bottle: " + fs::path(jsonl_paths[0]).filename().string()
                                  : fmt::format("bottle: {} runs", runs),
                        "the metrics' file name");
  ScratchFiles scratch;
  scratch.paths = {outputs.begin() + 1, outputs.end()};
  std::vector<std::string> curves;
  std::string lr_curve;
  for (size_t i = 0; i < runs; ++i) {
    const std::string& jsonl_path = jsonl_paths[i];
    const fs::path train_dat = data_file(i, "train"), val_dat = data_file(i, "val");
    const std::string train_in_script = gnuplot_path(train_dat),
                      val_in_script = gnuplot_path(val_dat),
                      name = runs == 1 ? "" : gnuplot_string(label(i), "the run's folder name");
    std::ofstream train(train_dat), val(val_dat);
    int64_t rows = 0, val_rows = 0;
    for_each_bounded_line(
        jsonl_path, "the metrics to plot", kMaxJsonLinesFileBytes, kMaxJsonLineBytes,
        [&](std::string_view line, int64_t line_no) {
          if (line.empty()) return;
          const auto j = nlohmann::json::parse(line.begin(), line.end(), nullptr, false);
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
        });
    train.close();
    val.close();
    BOTTLE_CHECK(train && val, "{}: cannot write the plot's data beside it (disk full?)", png_path);
    BOTTLE_CHECK(rows > 0, "{}: no training steps to plot", jsonl_path);
    // gnuplot joins string literals with '.'; one run keeps the plain titles.
    auto titled = [&](const char* what) {
      return runs == 1 ? fmt::format("'{}'", what) : fmt::format("{}.' {}'", name, what);
    };
    curves.push_back(fmt::format("{} using 1:2 with lines lw 1.5 title {}", train_in_script,
                                 titled("train loss")));
    if (val_rows > 0)
      curves.push_back(fmt::format("{} using 1:2 with linespoints lw 2 pt 7 title {}",
                                   val_in_script, titled("val loss")));
    if (i == 0)
      lr_curve = fmt::format("{} using 1:3 axes x1y2 with lines dt 2 lc rgb 'gray40' title {}",
                             train_in_script, titled("lr"));
  }
  curves.push_back(lr_curve);
  {
    std::ofstream gp(script);
    // noenhanced: a file name is text, not gnuplot's markup for sub- and superscripts.
    gp << png_in_script << "set title " << title << " noenhanced\n"
       << "set xlabel 'step'\nset ylabel 'loss (nats)'\nset y2label 'learning rate'\n"
       << "set ytics nomirror\nset y2tics\nset grid\nset key top right noenhanced\nplot ";
    for (size_t i = 0; i < curves.size(); ++i) gp << (i ? ", " : "") << curves[i];
    gp << "\n";
    gp.close();
    BOTTLE_CHECK(gp, "{}: cannot write the plot's script (disk full?)", script.string());
  }
  write_file_atomically(png_path, [&](const std::string& temp) { run_gnuplot(script, temp); });
}

}  // namespace bottle
