#include "bench/paper_emulated.h"

#include <algorithm>
#include <fstream>

#include "core/error.h"

namespace bottle {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

EmulatedRow parse_row(const fs::path& file) {
  std::ifstream in(file);
  BOTTLE_CHECK(in, "bench paper --emulated: cannot read {}", file.string());
  EmulatedRow row;
  row.file = file.string();
  try {
    const json j = json::parse(in);
    row.model = j.at("paper_model").get<std::string>();
    row.kind = j.at("kind").get<std::string>();
    row.layout = j.at("layout").get<std::string>();
    row.preset = j.at("preset").get<std::string>();
    row.precision = j.at("precision").get<std::string>();
    row.config = j.at("config").get<std::string>();
    row.tp = j.at("tp").get<int>();
    row.pp = j.at("pp").get<int>();
    row.dp = j.at("dp").get<int>();
    row.k = j.at("k").get<double>();
    for (const auto& [mode, m] : j.at("modes").items()) {
      EmulatedMode& e = row.modes[mode];
      e.measured_ms = m.at("measured_ms").get<double>();
      e.predicted_ms = m.at("predicted_ms").get<double>();
      if (!m.at("predicted_after_ms").is_null())
        e.predicted_after_ms = m.at("predicted_after_ms").get<double>();
    }
  } catch (const json::exception& e) {
    fail("bench paper --emulated: {}: {}", file.string(), e.what());
  }
  BOTTLE_CHECK(
      !row.model.empty(),
      "bench paper --emulated: {}: paper_model is empty (not a row of bench_emulated.sh --paper)",
      file.string());
  return row;
}

}  // namespace

std::optional<double> EmulatedRow::speedup(const std::string& over, bool predicted) const {
  const auto a = modes.find(over), b = modes.find("btp");
  if (a == modes.end() || b == modes.end()) return std::nullopt;
  return predicted ? a->second.predicted_ms / b->second.predicted_ms
                   : a->second.measured_ms / b->second.measured_ms;
}

std::vector<EmulatedRow> read_emulated_rows(const fs::path& dir,
                                            const std::vector<std::string>& paper_models) {
  BOTTLE_CHECK(fs::is_directory(dir), "bench paper --emulated: {} is not a directory",
               dir.string());
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.is_directory() && e.path().filename().string().starts_with("paper_") &&
        fs::exists(e.path() / "result.json"))
      files.push_back(e.path() / "result.json");
  BOTTLE_CHECK(!files.empty(),
               "bench paper --emulated: {} holds no paper_*/result.json (made by "
               "tools/cluster/bench_emulated.sh --paper MODELS --out {})",
               dir.string(), dir.string());
  std::sort(files.begin(), files.end());
  std::vector<EmulatedRow> rows;
  for (const fs::path& f : files) rows.push_back(parse_row(f));
  auto order = [&](const EmulatedRow& r) {
    return std::find(paper_models.begin(), paper_models.end(), r.model) - paper_models.begin();
  };
  for (const EmulatedRow& r : rows)
    BOTTLE_CHECK(size_t(order(r)) < paper_models.size(),
                 "bench paper --emulated: {}: paper_model '{}' is none of the paper's models",
                 r.file, r.model);
  std::stable_sort(rows.begin(), rows.end(),
                   [&](const EmulatedRow& a, const EmulatedRow& b) { return order(a) < order(b); });
  return rows;
}

json to_json(const EmulatedRow& row) {
  json modes = json::object();
  for (const auto& [mode, m] : row.modes)
    modes[mode] = {
        {"measured_ms", m.measured_ms},
        {"predicted_ms", m.predicted_ms},
        {"predicted_after_ms", m.predicted_after_ms ? json(*m.predicted_after_ms) : json(nullptr)}};
  return {{"file", row.file},     {"paper_model", row.model},
          {"kind", row.kind},     {"layout", row.layout},
          {"preset", row.preset}, {"precision", row.precision},
          {"config", row.config}, {"tp", row.tp},
          {"pp", row.pp},         {"dp", row.dp},
          {"k", row.k},           {"modes", modes}};
}

}  // namespace bottle
