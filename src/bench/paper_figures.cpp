#include "bench/paper_figures.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <functional>

#include "boost_paper_toml.h"  // generated from reference/boost_paper.toml
#include "core/error.h"

namespace bottle {
namespace {

// Units printed after the number, and how; counts are printed as bare numbers.
struct UnitStyle {
  const char* unit;
  const char* suffix;
  int decimals;  // -1: the shortest form that reads back as the same number
};
constexpr UnitStyle kMeasures[] = {{"s", " s", 2},    {"ms", " ms", 2},
                                   {"GB", " GB", -1}, {"MB/ms", " MB/ms", 1},
                                   {"×", "×", 2},     {"|difference|", "", -1}};
constexpr const char* kCounts[] = {"sequences", "GPUs", "features", "blocks", "heads", "tokens"};

const UnitStyle* measure(const std::string& unit) {
  for (const UnitStyle& s : kMeasures)
    if (unit == s.unit) return &s;
  return nullptr;
}

bool is_count(const std::string& unit) {
  for (const char* c : kCounts)
    if (unit == c) return true;
  return false;
}

// "7×10⁻⁷": how the paper writes a small difference.
std::string scientific(double v) {
  const std::string e = fmt::format("{:e}", v);  // "7.000000e-07": the exponent, exactly
  const size_t at = e.find('e');
  const double mantissa = std::stod(e.substr(0, at));
  const int exponent = std::stoi(e.substr(at + 1));
  static const char* const kDigits[] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
  std::string power = exponent < 0 ? "⁻" : "";
  for (char d : std::to_string(std::abs(exponent))) power += kDigits[d - '0'];
  return fmt::format("{:.3g}×10{}", mantissa, power);
}

std::string number_text(double v, const std::string& unit) {
  if (unit == "|difference|") return scientific(v);
  const UnitStyle* style = measure(unit);
  if (style && style->decimals >= 0) return fmt::format("{:.{}f}", v, style->decimals);
  if (std::nearbyint(v) == v && std::fabs(v) < 1e15) return fmt::format("{}", int64_t(v));
  return fmt::format("{}", v);
}

std::string suffix(const std::string& unit) {
  const UnitStyle* style = measure(unit);
  return style ? style->suffix : "";
}

}  // namespace

PaperFigures PaperFigures::built_in() {
  return PaperFigures(kBoostPaperToml, std::string(kBoostPaperToml_name) + " (built into bottle)");
}

PaperFigures::PaperFigures(std::string_view toml_text, std::string file_name)
    : file_name_(std::move(file_name)) {
  toml::table root;
  try {
    root = toml::parse(toml_text, file_name_);
  } catch (const toml::parse_error& e) {
    fail("{}:{}:{}: {}", file_name_, e.source().begin.line, e.source().begin.column,
         e.description());
  }
  // A table that holds anything but tables is an entry; the tables above it are sections.
  std::function<void(const toml::table&, const std::string&)> walk =
      [&](const toml::table& table, const std::string& prefix) {
        for (const auto& [key, node] : table) {
          const std::string name(key.str());
          const std::string id = prefix.empty() ? name : prefix + "." + name;
          const toml::table* sub = node.as_table();
          BOTTLE_CHECK(sub, "{}: '{}' stands outside any entry (an entry is a table with a source)",
                       file_name_, id);
          bool is_entry = false;
          for (const auto& [k, v] : *sub) is_entry = is_entry || !v.is_table();
          if (!is_entry) {
            BOTTLE_CHECK(!sub->empty(), "{}: '{}' is an empty table", file_name_, id);
            walk(*sub, id);
            continue;
          }
          Entry e;
          int kinds = 0;
          for (const auto& [k, v] : *sub) {
            const std::string name(k.str());
            auto number = [&](const toml::node& n) {
              BOTTLE_CHECK(n.is_number(), "{}: '{}.{}' must hold numbers", file_name_, id, name);
              const double v = n.value<double>().value();
              // TOML reads inf and nan as numbers; no figure of the paper is one.
              BOTTLE_CHECK(std::isfinite(v), "{}: '{}.{}' must hold finite numbers, got {}",
                           file_name_, id, name, v);
              return v;
            };
            if (name == "source" || name == "unit" || name == "text") {
              const auto s = v.value<std::string>();
              BOTTLE_CHECK(s && !s->empty(), "{}: '{}.{}' must be a string that is not empty",
                           file_name_, id, name);
              (name == "source" ? e.source : name == "unit" ? e.unit : e.text) = *s;
              if (name == "text") {
                e.kind = Entry::Kind::text;
                ++kinds;
              }
            } else if (name == "value" && v.is_array()) {
              for (const toml::node& n : *v.as_array()) e.numbers.push_back(number(n));
              BOTTLE_CHECK(!e.numbers.empty(), "{}: '{}.value' is an empty list", file_name_, id);
              e.kind = Entry::Kind::list;
              ++kinds;
            } else if (name == "value") {
              e.numbers = {number(v)};
              e.kind = Entry::Kind::number;
              ++kinds;
            } else if (name == "range") {
              const toml::array* ends = v.as_array();
              BOTTLE_CHECK(ends && ends->size() == 2, "{}: '{}.range' must be [low, high]",
                           file_name_, id);
              e.numbers = {number((*ends)[0]), number((*ends)[1])};
              BOTTLE_CHECK(e.numbers[0] <= e.numbers[1], "{}: '{}.range' must be [low, high]",
                           file_name_, id);
              e.kind = Entry::Kind::range;
              ++kinds;
            } else {
              fail(
                  "{}: '{}' has the unknown key '{}' (an entry holds a source and one of value, "
                  "range or text; value and range with a unit)",
                  file_name_, id, name);
            }
          }
          BOTTLE_CHECK(!e.source.empty(), "{}: '{}' has no source (where the paper states it)",
                       file_name_, id);
          BOTTLE_CHECK(kinds == 1, "{}: '{}' must hold exactly one of value, range or text",
                       file_name_, id);
          if (e.kind != Entry::Kind::text)
            BOTTLE_CHECK(
                measure(e.unit) || is_count(e.unit),
                "{}: '{}' has {} unit; the units are s, ms, GB, MB/ms, ×, |difference| and "
                "the counts sequences, GPUs, features, blocks, heads, tokens",
                file_name_, id, e.unit.empty() ? "no" : "the unknown '" + e.unit + "'");
          entries_[id] = std::move(e);
        }
      };
  walk(root, "");
}

const PaperFigures::Entry& PaperFigures::entry(const std::string& id) const {
  const auto it = entries_.find(id);
  BOTTLE_CHECK(it != entries_.end(), "{}: no entry '{}', which bench paper's report quotes",
               file_name_, id);
  return it->second;
}

nlohmann::json& PaperFigures::record(const std::string& id, const Entry& e) const {
  nlohmann::json& r = quoted_[id];
  switch (e.kind) {
    case Entry::Kind::number:
      r["value"] = e.numbers[0];
      break;
    case Entry::Kind::list:
      r["value"] = e.numbers;
      break;
    case Entry::Kind::range:
      r["range"] = e.numbers;
      break;
    case Entry::Kind::text:
      r["text"] = e.text;
      break;
  }
  if (!e.unit.empty()) r["unit"] = e.unit;
  r["source"] = e.source;
  return r;
}

double PaperFigures::value(const std::string& id) const {
  const Entry& e = entry(id);
  BOTTLE_CHECK(e.kind == Entry::Kind::number, "{}: '{}' must be a single number (value = N)",
               file_name_, id);
  record(id, e);
  return e.numbers[0];
}

std::vector<double> PaperFigures::values(const std::string& id) const {
  const Entry& e = entry(id);
  BOTTLE_CHECK(e.kind == Entry::Kind::list || e.kind == Entry::Kind::range,
               "{}: '{}' must be a list (value = [...]) or a range", file_name_, id);
  record(id, e);
  return e.numbers;
}

std::string PaperFigures::text(const std::string& id) const {
  const Entry& e = entry(id);
  BOTTLE_CHECK(e.kind == Entry::Kind::text, "{}: '{}' must be a text", file_name_, id);
  record(id, e)["printed"] = e.text;
  return e.text;
}

std::string PaperFigures::show(const std::string& id) const {
  const Entry& e = entry(id);
  std::string shown;
  switch (e.kind) {
    case Entry::Kind::text:
      return text(id);
    case Entry::Kind::number:
      shown = number_text(e.numbers[0], e.unit);
      break;
    case Entry::Kind::range:
      shown = number_text(e.numbers[0], e.unit) + "–" + number_text(e.numbers[1], e.unit);
      break;
    case Entry::Kind::list:
      for (double v : e.numbers) shown += (shown.empty() ? "" : " / ") + number_text(v, e.unit);
      break;
  }
  shown += suffix(e.unit);
  record(id, e)["printed"] = shown;
  return shown;
}

nlohmann::json PaperFigures::quoted() const { return quoted_; }

double paper_memory_per_model_state(const PaperFigures& paper) {
  const double state = paper.value("memory.weights") + paper.value("memory.gradients") +
                       paper.value("memory.optimizer");
  BOTTLE_CHECK(state > 0,
               "{}: the paper's model state per GPU (memory.weights + "
               "memory.gradients + memory.optimizer) must be positive",
               paper.file_name());
  return paper.value("memory.gpu_memory") / state;
}

std::vector<std::string> paper_iteration_models(const PaperFigures& paper) {
  std::vector<std::string> models;
  const std::string text = paper.text("iteration.models");  // "1B / 3B / 7B"
  for (size_t begin = 0; begin <= text.size();) {
    const size_t end = std::min(text.find(" / ", begin), text.size());
    models.push_back(text.substr(begin, end - begin));
    begin = end + 3;
  }
  return models;
}

}  // namespace bottle
