#pragma once
// The BOOST paper's figures and claims that `bench paper` sets its measurements beside:
// reference/boost_paper.toml, built into the binary (its format is described at its top).
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

class PaperFigures {
 public:
  // The figures built into this binary from reference/boost_paper.toml, none read yet.
  static PaperFigures built_in();

  // Parses `toml_text`, named `file_name` in errors, and checks every entry: a source, and
  // one of a value or a range with a unit the report can print, or a text.
  PaperFigures(std::string_view toml_text, std::string file_name);

  // The number of the entry `id` ("iteration.full_7b"); fails naming the file and the entry
  // when it is missing or is no single number.
  double value(const std::string& id) const;
  // The numbers of a list or the two ends of a range.
  std::vector<double> values(const std::string& id) const;
  // The sentence or phrase of a claim.
  std::string text(const std::string& id) const;
  // A figure as the report prints it, with its unit: "1.06 s", "0.36 / 0.60 / 1.06 s",
  // "1.46–1.91×", "7×10⁻⁷", "4096"; a claim's text as it stands.
  std::string show(const std::string& id) const;

  // Every entry read so far, by id: its value, range or text, unit, source, and what `show`
  // printed (when it was shown), so that a reader of results.json can check the report
  // against the file.
  nlohmann::json quoted() const;
  const std::string& file_name() const { return file_name_; }

 private:
  struct Entry {
    enum class Kind { number, list, range, text } kind = Kind::number;
    std::vector<double> numbers;
    std::string text, unit, source;
  };
  const Entry& entry(const std::string& id) const;
  nlohmann::json& record(const std::string& id, const Entry& e) const;

  std::string file_name_;
  std::map<std::string, Entry> entries_;
  mutable nlohmann::json quoted_ = nlohmann::json::object();
};

// How many times CoLA-7B's weights, gradients and optimizer state per GPU fit into the
// paper's GPU memory: `bench paper`'s default memory limit is this many times the model state
// per rank, the paper's proportion.
double paper_memory_per_model_state(const PaperFigures& paper);

// The models of the paper's iteration-time table ("1B", "3B", ...), in its order: the lists
// iteration.full, .boost_speedup_over_full and the others hold one value per model.
std::vector<std::string> paper_iteration_models(const PaperFigures& paper);

}  // namespace bottle
