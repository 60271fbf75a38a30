// `bottle bench paper --quick`: it completes on this machine and writes the report, its
// plots (real PNGs) and the results; CI checks no measured figure (they are the report's
// business), but checks that every figure of the paper it quotes is the one in
// reference/boost_paper.toml.
#include <toml++/toml.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "bench/paper_figures.h"
#include "core/error.h"
#include "test_util.h"

namespace bottle::testing {
namespace {

const fs::path kPaperFigures = fs::path(BOTTLE_SOURCE_DIR) / "reference/boost_paper.toml";

bool is_png(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[8] = {};
  in.read(magic, sizeof(magic));
  return in && std::string(magic, 8) == "\x89PNG\r\n\x1a\n" && fs::file_size(path) > 1000;
}

// DIR/NAME/result.json as tools/cluster/bench_emulated.sh --paper writes it: one of the paper's
// models run on an emulated cluster, with each mode's measured and predicted milliseconds.
void write_emulated_row(const fs::path& dir, const std::string& name, const std::string& model,
                        const std::string& kind, int tp, int pp,
                        const std::map<std::string, std::pair<double, double>>& modes) {
  nlohmann::json m = nlohmann::json::object();
  for (const auto& [mode, ms] : modes)
    m[mode] = {
        {"measured_ms", ms.first}, {"predicted_ms", ms.second}, {"predicted_after_ms", nullptr}};
  fs::create_directories(dir / name);
  std::ofstream(dir / name / "result.json") << nlohmann::json{
      {"kind", kind},
      {"layout", fmt::format("{}x{}x1", tp, pp)},
      {"tp", tp},
      {"pp", pp},
      {"dp", 1},
      {"config", (dir / ("paper_" + model + ".toml")).string()},
      {"k", 250.0},
      {"preset", "a100-perlmutter"},
      {"precision", "fp32"},
      {"paper_model", model},
      {"modes", m}}.dump();
}

// One `bench paper --quick` run (about a minute) for all the checks of its output, with two
// rows of the emulated cluster's section given as bench_emulated.sh would write them (the
// section's rendering is checked here; the cluster runs are tools/cluster's).
class BenchPaperQuick : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::make_unique<TempDir>();
    out_ = fs::path(*dir_ / "paper");
    const fs::path emulated = *dir_ / "emulated";
    write_emulated_row(emulated, "paper_3B_1", "3B", "bench_tp", 2, 1,
                       {{"full", {1500, 1400}}, {"vanilla", {2900, 2700}}, {"btp", {1000, 1120}}});
    write_emulated_row(emulated, "paper_13B_1", "13B", "train", 4, 2,
                       {{"full", {6000, 6600}}, {"vanilla", {9000, 8000}}, {"btp", {4000, 4120}}});
    run_ = run(fmt::format("timeout 600 {} bench paper --quick --out {} --emulated {}",
                           bottle_binary(), out_.string(), emulated.string()));
    std::ifstream in(out_ / "report.md");
    report_.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  static void TearDownTestSuite() { dir_.reset(); }
  void SetUp() override {
    ASSERT_EQ(run_.status, 0) << run_.output;
    ASSERT_TRUE(fs::exists(out_ / "report.md")) << run_.output;
  }

  static std::unique_ptr<TempDir> dir_;
  static fs::path out_;
  static CommandResult run_;
  static std::string report_;
};
std::unique_ptr<TempDir> BenchPaperQuick::dir_;
fs::path BenchPaperQuick::out_;
CommandResult BenchPaperQuick::run_;
std::string BenchPaperQuick::report_;

TEST_F(BenchPaperQuick, WritesTheReportAndItsPlots) {
  const fs::path& out = out_;
  const std::string& report = report_;
  for (const char* png : {"iteration", "emulated", "microbatch", "kinds", "comm", "grouping",
                          "memory", "recompute", "loss"}) {
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

// The entries of reference/boost_paper.toml by id ("iteration.full_7b"): a table that holds
// anything but tables is an entry, the tables above it are sections.
std::map<std::string, const toml::table*> paper_entries(const toml::table& table,
                                                        const std::string& prefix = "") {
  std::map<std::string, const toml::table*> entries;
  for (const auto& [key, node] : table) {
    const std::string name(key.str());
    const std::string id = prefix.empty() ? name : prefix + "." + name;
    const toml::table* sub = node.as_table();
    if (!sub) {
      ADD_FAILURE() << kPaperFigures << ": '" << id << "' stands outside any entry";
      continue;
    }
    bool is_entry = false;
    for (const auto& [k, v] : *sub) is_entry = is_entry || !v.is_table();
    if (is_entry)
      entries[id] = sub;
    else
      entries.merge(paper_entries(*sub, id));
  }
  return entries;
}

toml::table parse_paper_figures() {
  try {
    return toml::parse_file(kPaperFigures.string());
  } catch (const toml::parse_error& e) {
    ADD_FAILURE() << kPaperFigures << ": " << e.description();
    return {};
  }
}

std::vector<double> numbers_of(const toml::node& node) {
  std::vector<double> numbers;
  if (const toml::array* list = node.as_array())
    for (const toml::node& n : *list) numbers.push_back(n.value<double>().value_or(NAN));
  else
    numbers.push_back(node.value<double>().value_or(NAN));
  return numbers;
}

TEST(PaperFigures, EveryEntryHasASourceAndAUnit) {
  const toml::table root = parse_paper_figures();
  const auto entries = paper_entries(root);
  EXPECT_GT(entries.size(), 40u);
  for (const auto& [id, entry] : entries) {
    SCOPED_TRACE(id);
    const auto source = (*entry)["source"].value<std::string>();
    EXPECT_TRUE(source && !source->empty()) << "no source";
    const int kinds = int(entry->contains("value")) + int(entry->contains("range")) +
                      int(entry->contains("text"));
    EXPECT_EQ(kinds, 1) << "one of value, range or text";
    if (entry->contains("value") || entry->contains("range")) {
      const auto unit = (*entry)["unit"].value<std::string>();
      EXPECT_TRUE(unit && !unit->empty()) << "no unit";
      const toml::node& figure =
          entry->contains("value") ? *entry->get("value") : *entry->get("range");
      for (double v : numbers_of(figure)) EXPECT_TRUE(std::isfinite(v)) << "not a number";
    }
    for (const auto& [key, value] : *entry)
      EXPECT_TRUE(std::set<std::string>({"value", "range", "text", "unit", "source"})
                      .count(std::string(key.str())))
          << "unknown key " << key.str();
  }
}

// The copy built into bottle is the file as it is now (the build generates it again whenever
// the file changes).
TEST(PaperFigures, TheBuiltInCopyIsTheFile) {
  std::ifstream in(kPaperFigures);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const PaperFigures from_file(text, kPaperFigures.string());
  const PaperFigures built_in = PaperFigures::built_in();
  const toml::table root = parse_paper_figures();
  for (const auto& [id, entry] : paper_entries(root)) {
    EXPECT_EQ(built_in.show(id), from_file.show(id)) << id;
  }
  EXPECT_EQ(built_in.quoted(), from_file.quoted());
}

TEST(PaperFigures, HowFiguresArePrinted) {
  const PaperFigures paper(R"(
[a.time]
value = 0.6
unit = "s"
source = "Table 1"
[a.times]
value = [0.36, 0.60, 1.06]
unit = "s"
source = "Table 1"
[a.speedup]
range = [1.46, 1.91]
unit = "×"
source = "Abstract"
[a.error]
value = 7e-7
unit = "|difference|"
source = "Table 2"
[a.width]
value = 4096
unit = "features"
source = "Section 3"
[a.memory]
value = 2.50
unit = "GB"
source = "Table 3"
[a.setting]
text = "LLaMA-7B, TP 4"
source = "Table 1"
)",
                           "test.toml");
  EXPECT_EQ(paper.show("a.time"), "0.60 s");
  EXPECT_EQ(paper.show("a.times"), "0.36 / 0.60 / 1.06 s");
  EXPECT_EQ(paper.show("a.speedup"), "1.46–1.91×");
  EXPECT_EQ(paper.show("a.error"), "7×10⁻⁷");
  EXPECT_EQ(paper.show("a.width"), "4096");
  EXPECT_EQ(paper.show("a.memory"), "2.5 GB");
  EXPECT_EQ(paper.show("a.setting"), "LLaMA-7B, TP 4");
  EXPECT_EQ(paper.value("a.width"), 4096);
  EXPECT_EQ(paper.quoted().at("a.times").at("printed"), "0.36 / 0.60 / 1.06 s");
  EXPECT_EQ(paper.quoted().at("a.times").at("source"), "Table 1");
}

// A broken file is one error naming the file and the entry.
TEST(PaperFigures, BadEntriesNameTheFileAndTheEntry) {
  auto error_of = [](const std::string& text) -> std::string {
    try {
      PaperFigures paper(text, "figures.toml");
      paper.value("a.b");
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  const std::pair<const char*, const char*> cases[] = {
      {"[a.b]\nvalue = 1\nunit = \"s\"\n", "figures.toml: 'a.b' has no source"},
      {"[a.b]\nvalue = 1\nsource = \"x\"\n", "figures.toml: 'a.b' has no unit"},
      {"[a.b]\nvalue = 1\nunit = \"furlongs\"\nsource = \"x\"\n",
       "figures.toml: 'a.b' has the unknown 'furlongs' unit"},
      {"[a.b]\nvalue = 1\ntext = \"t\"\nunit = \"s\"\nsource = \"x\"\n",
       "figures.toml: 'a.b' must hold exactly one of value, range or text"},
      {"[a.b]\nrange = [2, 1]\nunit = \"s\"\nsource = \"x\"\n",
       "figures.toml: 'a.b.range' must be [low, high]"},
      {"[a.b]\nvalue = \"one\"\nunit = \"s\"\nsource = \"x\"\n",
       "figures.toml: 'a.b.value' must hold numbers"},
      {"[a.b]\nvalue = 1\nunit = \"s\"\nsource = \"x\"\nnote = 2\n",
       "figures.toml: 'a.b' has the unknown key 'note'"},
      {"[a.c]\nvalue = 1\nunit = \"s\"\nsource = \"x\"\n", "figures.toml: no entry 'a.b'"},
      {"[a.b]\nvalue = [1, 2]\nunit = \"s\"\nsource = \"x\"\n",
       "figures.toml: 'a.b' must be a single number"},
      {"[a.b]\nvalue = inf\nunit = \"s\"\nsource = \"x\"\n",
       "figures.toml: 'a.b.value' must hold finite numbers"},
      {"[a.b]\nrange = [1, nan]\nunit = \"s\"\nsource = \"x\"\n",
       "figures.toml: 'a.b.range' must hold finite numbers"},
      {"stray = 1\n", "figures.toml: 'stray' stands outside any entry"},
      {"[a.b\nvalue = 1\n", "figures.toml:1:"},
  };
  for (const auto& [text, expected] : cases)
    EXPECT_NE(error_of(text).find(expected), std::string::npos)
        << text << "\ngave: " << error_of(text);
}

// The numbers a figure was printed as ("0.36 / 0.60 / 1.06 s", "1.46–1.91×", "7×10⁻⁷"), each
// with the half-width of its last printed digit.
std::vector<std::pair<double, double>> printed_numbers(const std::string& printed) {
  std::vector<std::pair<double, double>> numbers;
  const size_t power = printed.find("×10");
  if (power != std::string::npos) {
    static const std::vector<std::string> kDigits = {"⁰", "¹", "²", "³", "⁴",
                                                     "⁵", "⁶", "⁷", "⁸", "⁹"};
    std::string rest = printed.substr(power + std::string("×10").size());
    int sign = 1, exponent = 0;
    if (rest.rfind("⁻", 0) == 0) {
      sign = -1;
      rest = rest.substr(std::string("⁻").size());
    }
    while (!rest.empty()) {
      size_t d = 0;
      while (d < kDigits.size() && rest.rfind(kDigits[d], 0) != 0) ++d;
      if (d == kDigits.size()) break;
      exponent = exponent * 10 + int(d);
      rest = rest.substr(kDigits[d].size());
    }
    const double scale = std::pow(10.0, sign * exponent);
    numbers.push_back({std::stod(printed.substr(0, power)) * scale, 0.5 * scale});
    return numbers;
  }
  const std::regex number(R"(-?[0-9]+(\.([0-9]+))?)");
  for (auto it = std::sregex_iterator(printed.begin(), printed.end(), number);
       it != std::sregex_iterator(); ++it)
    numbers.push_back({std::stod(it->str()), 0.5 * std::pow(10.0, -double((*it)[2].length()))});
  return numbers;
}

TEST_F(BenchPaperQuick, QuotesThePaperFiguresOfTheDataFile) {
  const toml::table root = parse_paper_figures();
  const auto entries = paper_entries(root);
  const auto results = nlohmann::json::parse(std::ifstream(out_ / "results.json"));
  const nlohmann::json& quoted = results.at("paper").at("quoted");
  // The report quotes every entry of the file, and nothing else.
  std::set<std::string> in_file, in_report;
  for (const auto& [id, entry] : entries) in_file.insert(id);
  for (const auto& [id, q] : quoted.items()) in_report.insert(id);
  EXPECT_EQ(in_report, in_file);
  for (const auto& [id, q] : quoted.items()) {
    SCOPED_TRACE(id);
    const auto found = entries.find(id);
    if (found == entries.end()) continue;
    const toml::table& entry = *found->second;
    EXPECT_EQ(q.at("source").get<std::string>(), entry["source"].value_or(std::string()));
    if (entry.contains("text")) {
      const std::string text = entry["text"].value_or(std::string());
      EXPECT_EQ(q.at("text").get<std::string>(), text);
      EXPECT_EQ(q.value("printed", ""), text);
      EXPECT_NE(report_.find(text), std::string::npos) << "report.md does not quote it";
      continue;
    }
    EXPECT_EQ(q.at("unit").get<std::string>(), entry["unit"].value_or(std::string()));
    const char* kind = entry.contains("value") ? "value" : "range";
    const std::vector<double> expected = numbers_of(*entry.get(kind));
    const nlohmann::json& read = q.at(kind);
    const std::vector<double> got =
        read.is_array() ? read.get<std::vector<double>>() : std::vector<double>{read.get<double>()};
    EXPECT_EQ(got, expected) << "the report read another value than the file's";
    if (!q.contains("printed")) continue;  // only used in a computation (a sum, a ratio)
    const std::string printed = q.at("printed").get<std::string>();
    EXPECT_NE(report_.find(printed), std::string::npos)
        << "report.md does not show '" << printed << "'";
    const auto shown = printed_numbers(printed);
    ASSERT_EQ(shown.size(), expected.size()) << "printed as '" << printed << "'";
    for (size_t i = 0; i < shown.size(); ++i)
      EXPECT_NEAR(shown[i].first, expected[i], shown[i].second * (1 + 1e-9))
          << "printed as '" << printed << "'";
  }
}

// The emulated rows: the paper's models in its order, each mode's measured / predicted time
// with the error, btp's speedups beside the paper's for that model, and how many predictions
// fall within ±15 %.
TEST_F(BenchPaperQuick, ShowsTheEmulatedRowsBesideThePaper) {
  const size_t at = report_.find("## Iteration time on an emulated GPU cluster");
  ASSERT_NE(at, std::string::npos) << report_;
  const std::string section = report_.substr(at, report_.find("\n## ", at + 1) - at);
  const size_t row3 = section.find(
      "| 3B | TP 2 (paper_3B.toml) | 250 | 1500 / 1400 (-7 %) | "
      "2900 / 2700 (-7 %) | 1000 / 1120 (+12 %) | 1.50× · 1.25× · "
      "1.46× | 2.90× · 2.41× · 1.81× |");
  const size_t row13 = section.find(
      "| 13B | TP 4 × PP 2 (paper_13B.toml) | 250 | 6000 / 6600 "
      "(+10 %) | 9000 / 8000 (-11 %) | 4000 / 4120 (+3 %) | 1.50× · "
      "1.60× · 1.59× | 2.25× · 1.94× · 1.86× |");
  EXPECT_NE(row3, std::string::npos) << section;
  EXPECT_NE(row13, std::string::npos) << section;
  EXPECT_LT(row3, row13) << "rows not in the paper's order:\n" << section;
  EXPECT_NE(section.find("6 of 6 iteration times predicted within ±15 %"), std::string::npos)
      << section;
  const auto results = nlohmann::json::parse(std::ifstream(out_ / "results.json"));
  ASSERT_EQ(results.at("emulated").size(), 2u);
  EXPECT_EQ(results.at("emulated")[0].at("paper_model"), "3B");
  EXPECT_EQ(results.at("emulated")[1].at("modes").at("btp").at("measured_ms"), 4000.0);
}

// A result.json that is not one of bench_emulated.sh's fails before anything runs, naming the
// file and the key; a folder without any is named too.
TEST(BenchPaper, BadEmulatedRowsNameTheFile) {
  TempDir dir;
  write_emulated_row(dir / "emulated", "paper_7B_1", "7B", "bench_tp", 4, 1,
                     {{"btp", {1000, 1000}}});
  {
    std::ofstream(dir / "emulated/paper_7B_1/result.json") << R"({"kind": "bench_tp"})";
    const CommandResult r = run(fmt::format("{} bench paper --quick --out {} --emulated {}",
                                            bottle_binary(), dir / "paper", dir / "emulated"));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_NE(r.output.find(dir / "emulated/paper_7B_1/result.json" + ": "), std::string::npos)
        << r.output;
    EXPECT_NE(r.output.find("paper_model"), std::string::npos) << r.output;
    EXPECT_EQ(r.output.find("bench paper: tp1"), std::string::npos) << "it ran:\n" << r.output;
  }
  {
    fs::create_directories(dir / "empty");
    const CommandResult r = run(fmt::format("{} bench paper --quick --out {} --emulated {}",
                                            bottle_binary(), dir / "paper", dir / "empty"));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(count_occurrences(r.output, "holds no paper_*/result.json"), 1) << r.output;
  }
  {
    write_emulated_row(dir / "other", "paper_2B_1", "2B", "bench_tp", 2, 1,
                       {{"btp", {1000, 1000}}});
    const CommandResult r = run(fmt::format("{} bench paper --quick --out {} --emulated {}",
                                            bottle_binary(), dir / "paper", dir / "other"));
    EXPECT_EQ(r.status, 1) << r.output;
    EXPECT_EQ(count_occurrences(r.output, "paper_model '2B' is none of the paper's models"), 1)
        << r.output;
  }
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
