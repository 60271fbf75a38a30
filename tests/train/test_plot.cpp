// The plotting module (src/train/plot.h) that `train`, `bottle plot` and `bench paper` share:
// gnuplot runs without a shell, paths reach its script as quoted strings, and a missing or
// failing gnuplot is one clear error naming the plot.
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "test_util.h"
#include "train/plot.h"

namespace bottle::testing {
namespace {

bool is_png(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, sizeof(magic));
  return in && std::string(magic, 8) == "\x89PNG\r\n\x1a\n" && fs::file_size(path) > 1000;
}

void write_metrics(const fs::path& path) {
  std::ofstream out(path);
  for (int s = 1; s <= 20; ++s) {
    out << nlohmann::json{{"step", s}, {"loss", 4.0 - 0.1 * s}, {"lr", 1e-3}}.dump() << "\n";
    if (s % 10 == 0) out << nlohmann::json{{"step", s}, {"val_loss", 4.1 - 0.1 * s}}.dump() << "\n";
  }
}

// Sets an environment variable for one scope and puts the old value back.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const std::string& value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    ::setenv(name, value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Works in another folder for one scope.
class ScopedCurrentPath {
 public:
  explicit ScopedCurrentPath(const fs::path& path) : old_(fs::current_path()) {
    fs::current_path(path);
  }
  ~ScopedCurrentPath() { fs::current_path(old_); }

 private:
  fs::path old_;
};

// A folder that holds every program on PATH but gnuplot (as links): the PATH of a machine
// without gnuplot, on which bottle itself still starts (Open MPI looks for its helpers there).
std::string path_without_gnuplot(const fs::path& folder) {
  fs::create_directories(folder);
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "/usr/bin:/bin";
  for (size_t start = 0; start <= path.size();) {
    const size_t end = std::min(path.find(':', start), path.size());
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(path.substr(start, end - start), ec)) {
      const std::string name = entry.path().filename().string();
      if (name.rfind("gnuplot", 0) == 0) continue;
      fs::create_symlink(entry.path(), folder / name, ec);  // the first on PATH wins
    }
    start = end + 1;
  }
  return folder.string();
}

// One word for /bin/sh, for the command lines of these tests only.
std::string sh_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

TEST(Plot, GnuplotStringsDoubleTheirQuotes) {
  EXPECT_EQ(gnuplot_string("plain", "a title"), "'plain'");
  EXPECT_EQ(gnuplot_string("it's a \"test\" $HOME `x` \\", "a title"),
            "'it''s a \"test\" $HOME `x` \\'");
  const std::string error = error_of([] { gnuplot_string("two\nlines", "the path"); });
  EXPECT_NE(error.find("two\nlines"), std::string::npos) << error;
  EXPECT_NE(error.find("the path holds a line break"), std::string::npos) << error;
}

// Several runs in one plot (fp32 against bf16, say): each run named after its folder, a
// quote in a folder name included; the scratch files of every run are gone afterwards.
TEST(Plot, SeveralRunsInOnePng) {
  TempDir dir;
  const fs::path a = fs::path(dir.str()) / "fp32", b = fs::path(dir.str()) / "bf16 'x'";
  fs::create_directories(a);
  fs::create_directories(b);
  write_metrics(a / "metrics.jsonl");
  write_metrics(b / "metrics.jsonl");
  const fs::path png = fs::path(dir.str()) / "both.png";
  const CommandResult r = run(fmt::format(
      "{} plot {} {} --out {}", bottle_binary(), sh_quote((a / "metrics.jsonl").string()),
      sh_quote((b / "metrics.jsonl").string()), sh_quote(png.string())));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(is_png(png));
  size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator(dir.str())) ++files;
  EXPECT_EQ(files, 3u);  // the two run folders and the plot
  const std::string missing = error_of([&] {
    plot_metrics({(a / "metrics.jsonl").string(), (b / "none.jsonl").string()}, png.string());
  });
  EXPECT_NE(missing.find("none.jsonl"), std::string::npos) << missing;
}

TEST(Plot, PathWithASpaceAndAQuote) {
  TempDir dir;
  const fs::path folder = fs::path(dir.str()) / "it's a run";
  fs::create_directories(folder);
  const fs::path metrics = folder / "metrics 'x'.jsonl", png = folder / "loss 'x' y.png";
  write_metrics(metrics);
  plot_metrics(metrics.string(), png.string());
  EXPECT_TRUE(is_png(png));
  // Only the metrics and the plot: the scratch files are gone.
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(folder))
    names.push_back(entry.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"loss 'x' y.png", "metrics 'x'.jsonl"}));
  // The same through `bottle plot`.
  const fs::path cli_png = folder / "cli 'plot'.png";
  const CommandResult r = run(fmt::format("{} plot {} --out {}", bottle_binary(),
                                          sh_quote(metrics.string()), sh_quote(cli_png.string())));
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(is_png(cli_png));
}

// gnuplot reads an output name that starts with '|', or a data file name that starts with
// '<', as a shell command: every path reaches the script absolute, so such a name is a file.
TEST(Plot, NamesThatGnuplotWouldRunAreFiles) {
  TempDir dir;
  const ScopedCurrentPath here(dir.str());
  write_metrics("<metrics.jsonl");
  plot_metrics("<metrics.jsonl", "|touch ran.png");
  EXPECT_TRUE(is_png(fs::path(dir.str()) / "|touch ran.png"));
  EXPECT_FALSE(fs::exists(fs::path(dir.str()) / "ran.png")) << "gnuplot ran the name";
}

TEST(Plot, PathGnuplotCannotQuote) {
  TempDir dir;
  const fs::path folder = fs::path(dir.str()) / "two\nlines";
  fs::create_directories(folder);
  write_metrics(folder / "metrics.jsonl");
  const std::string png = (folder / "loss.png").string();
  const std::string error =
      error_of([&] { plot_metrics((folder / "metrics.jsonl").string(), png); });
  EXPECT_NE(error.find(png), std::string::npos) << error;
  EXPECT_NE(error.find("line break"), std::string::npos) << error;
  EXPECT_FALSE(fs::exists(png));
}

TEST(Plot, MissingGnuplotIsAClearError) {
  TempDir dir;
  write_metrics(dir / "metrics.jsonl");
  const std::string without_gnuplot = path_without_gnuplot(dir / "bin");
  ASSERT_FALSE(fs::exists(fs::path(without_gnuplot) / "gnuplot"));
  {
    const ScopedEnv path("PATH", without_gnuplot);
    const std::string error =
        error_of([&] { plot_metrics(dir / "metrics.jsonl", dir / "loss.png"); });
    EXPECT_NE(error.find(dir / "loss.png"), std::string::npos) << error;
    EXPECT_NE(error.find("gnuplot is not on PATH"), std::string::npos) << error;
  }
  EXPECT_FALSE(fs::exists(dir / "loss.png"));
  EXPECT_TRUE(fs::exists(dir / "metrics.jsonl"));
  // The same through `bottle plot`: one message, exit status 1, no crash.
  const CommandResult r =
      run(fmt::format("PATH={} {} plot {} --out {}", without_gnuplot, bottle_binary(),
                      dir / "metrics.jsonl", dir / "loss.png"));
  EXPECT_EQ(r.status, 1) << r.output;
  EXPECT_EQ(count_occurrences(r.output, "gnuplot is not on PATH"), 1) << r.output;
  EXPECT_NE(r.output.find(dir / "loss.png"), std::string::npos) << r.output;
}

TEST(Plot, GnuplotsOwnErrorIsShown) {
  TempDir dir;
  const fs::path script = dir / "broken.gp", png = dir / "broken.png";
  std::ofstream(script) << gnuplot_png_preamble(png, 300, 200) << "plot "
                        << gnuplot_path(dir / "no such data.dat") << " using 1:2\n";
  const std::string error = error_of([&] { run_gnuplot(script, png); });
  EXPECT_NE(error.find(png.string()), std::string::npos) << error;
  EXPECT_NE(error.find("gnuplot failed"), std::string::npos) << error;
  EXPECT_NE(error.find("no such data.dat"), std::string::npos) << "gnuplot's message: " << error;
}

}  // namespace
}  // namespace bottle::testing
