// `bottle bench paper --quick`: it completes on this machine and writes the report, its
// plots (real PNGs) and the results; CI checks no figure (they are the report's business).
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"

namespace bottle::testing {
namespace {

bool is_png(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, sizeof(magic));
  return in && std::string(magic, 8) == "\x89PNG\r\n\x1a\n" && fs::file_size(path) > 1000;
}

TEST(BenchPaper, QuickWritesTheReportAndItsPlots) {
  TempDir dir;
  const fs::path out(dir / "paper");
  const CommandResult r = run(
      fmt::format("timeout 600 {} bench paper --quick --out {}", bottle_binary(), out.string()));
  ASSERT_EQ(r.status, 0) << r.output;
  ASSERT_TRUE(fs::exists(out / "report.md")) << r.output;
  std::ifstream in(out / "report.md");
  const std::string report((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const char* png :
       {"iteration", "microbatch", "kinds", "comm", "grouping", "memory", "recompute", "loss"}) {
    EXPECT_TRUE(is_png(out / (std::string(png) + ".png"))) << png;
    EXPECT_NE(report.find(std::string("(") + png + ".png)"), std::string::npos)
        << "report.md does not show " << png;
  }
  EXPECT_EQ(report.find("n/a"), std::string::npos) << "a figure is missing:\n" << report;
  const auto results = nlohmann::json::parse(std::ifstream(out / "results.json"));
  EXPECT_EQ(results.at("scale"), "quick");
  EXPECT_EQ(results.at("tp").size(), 3u);
  // CPU-dependent figures stand next to what they depend on: the CPU, the kernels oneDNN
  // dispatches to, and the OpenBLAS kernels the PyTorch peer actually ran.
  EXPECT_FALSE(results.at("machine").value("onednn_isa", "").empty());
  ASSERT_FALSE(results.at("torch").empty());
  const std::string blas = results.at("torch")[0].value("torch_blas_core", "");
  EXPECT_FALSE(blas.empty() || blas == "?") << results.at("torch")[0].dump();
  EXPECT_NE(report.find("OpenBLAS kernels: " + blas), std::string::npos) << report;
  for (const auto& row : results.at("torch"))
    EXPECT_TRUE(row.at("mfu").is_null() || row.at("mfu").get<double>() <= 1.0) << row.dump();
}

TEST(BenchPaper, RefusesToRunUnderMpirun) {
  TempDir dir;
  const CommandResult r = run(
      fmt::format("{} {} bench paper --quick --out {}", mpirun(1), bottle_binary(), dir / "paper"));
  EXPECT_NE(r.status, 0);
  EXPECT_EQ(count_occurrences(r.output, "bench paper: run it as one process"), 1) << r.output;
}

}  // namespace
}  // namespace bottle::testing
