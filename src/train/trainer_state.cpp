#include "train/trainer_state.h"

#include <algorithm>
#include <cstring>
#include <fstream>

#include "core/error.h"
#include "io/json_io.h"

namespace bottle {

namespace fs = std::filesystem;

namespace {

nlohmann::json state_to_json(const TrainerState& s) {
  // nlohmann's objects keep their keys sorted: the file's order does not depend on this list.
  nlohmann::json j{{"step", s.step},
                   {"optimizer_steps", s.optimizer_steps},
                   {"train_position", s.train_position}};
  if (s.seed) j["seed"] = *s.seed;
  if (s.data_shards) j["data_shards"] = *s.data_shards;
  if (!s.metrics_lines.empty()) j["metrics_lines"] = s.metrics_lines;
  j["config"] = s.config;
  return j;
}

// The step in the directory's name (step_00000005) matches the file's, when the name is one.
void check_step_matches_directory(const std::string& dir, const std::string& path, int64_t step) {
  fs::path where = fs::path(dir).lexically_normal();
  if (where.filename().empty()) where = where.parent_path();  // "run/step_5/"
  const std::string name = where.filename().string(),
                    digits = name.substr(std::min(name.size(), std::strlen(kStepPrefix)));
  if (name.rfind(kStepPrefix, 0) == 0 && !digits.empty() && digits.size() <= 18 &&
      digits.find_first_not_of("0123456789") == std::string::npos)
    BOTTLE_CHECK(std::stoll(digits) == step,
                 "{}: key 'step' is {} but the checkpoint directory is {}", path, step, name);
}

TrainerState state_from_json(const nlohmann::json& state, const std::string& dir,
                             const std::string& path) {
  BOTTLE_CHECK(state.is_object(), "{}: expected a JSON object, got {}", path, state.type_name());
  auto integer = [&](const char* key, int64_t lo, int64_t hi) {
    BOTTLE_CHECK(state.contains(key), "{}: missing key '{}'", path, key);
    const nlohmann::json& v = state[key];
    const bool fits = v.is_number_integer() &&
                      !(v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(INT64_MAX));
    BOTTLE_CHECK(fits && v.get<int64_t>() >= lo && v.get<int64_t>() <= hi,
                 "{}: key '{}' must be an integer in [{}, {}], got {}", path, key, lo, hi,
                 v.dump());
    return v.get<int64_t>();
  };
  TrainerState s;
  s.step = integer("step", 0, INT64_MAX);
  check_step_matches_directory(dir, path, s.step);
  s.optimizer_steps = integer("optimizer_steps", 0, s.step);  // skipped steps take none
  if (state.contains("seed")) s.seed = integer("seed", INT64_MIN, INT64_MAX);
  BOTTLE_CHECK(state.contains("train_position"), "{}: missing key 'train_position'", path);
  try {
    s.train_position = state["train_position"].get<DataPosition>();
  } catch (const Error& e) {
    fail("{}: key 'train_position': {}", path, e.what());
  }
  if (state.contains("data_shards")) {
    try {
      BOTTLE_CHECK(state["data_shards"].is_array(), "expected an array, got {}",
                   state["data_shards"].type_name());
      s.data_shards = state["data_shards"].get<std::vector<SourceRecord>>();
    } catch (const Error& e) {
      fail("{}: key 'data_shards': {}", path, e.what());
    }
  }
  if (state.contains("metrics_lines")) {
    const nlohmann::json& lines = state["metrics_lines"];
    BOTTLE_CHECK(lines.is_array() && std::all_of(lines.begin(), lines.end(),
                                                 [](const auto& l) { return l.is_string(); }),
                 "{}: key 'metrics_lines' must be an array of strings", path);
    s.metrics_lines = lines.get<std::vector<std::string>>();
  }
  if (state.contains("config") && state["config"].is_string())
    s.config = state["config"].get<std::string>();
  return s;
}

}  // namespace

void write_trainer_state(const fs::path& dir, const TrainerState& state) {
  const fs::path path = dir / kTrainerStateFile;
  std::ofstream out(path, std::ios::trunc);
  out << state_to_json(state).dump(2) << "\n";
  out.flush();
  BOTTLE_CHECK(out, "{}: write failed", path.string());
}

TrainerState read_trainer_state(const std::string& dir) {
  const std::string path = (fs::path(dir) / kTrainerStateFile).string();
  return state_from_json(read_json_file(path), dir, path);
}

}  // namespace bottle
