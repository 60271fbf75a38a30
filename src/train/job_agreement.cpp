#include "train/job_agreement.h"

#include <algorithm>
#include <climits>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace bottle {

namespace {

// A value too long to read in one line (a data file list) is shortened in the message only.
std::string shortened(const std::string& value) {
  constexpr size_t kMax = 160;
  return value.size() <= kMax ? value : value.substr(0, kMax) + "…";
}

using KeyValues = std::vector<std::pair<std::string, std::string>>;

// The resolved TOML as (section.key, value) in its own order: to_toml writes one key per
// line, "name = value" or "# name: unset (default: …)" for a key without a value.
KeyValues resolved_keys(const std::string& toml) {
  KeyValues keys;
  std::string section;
  std::istringstream in(toml);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    if (line.front() == '[' && line.back() == ']') {
      section = line.substr(1, line.size() - 2);
      continue;
    }
    std::string name, value;
    if (line.rfind("# ", 0) == 0) {
      const size_t colon = line.find(':');
      if (colon == std::string::npos) continue;  // the header comment
      name = line.substr(2, colon - 2);
      value = "unset";
    } else {
      const size_t eq = line.find(" = ");
      name = line.substr(0, eq);
      value = eq == std::string::npos ? "" : line.substr(eq + 3);
    }
    keys.emplace_back(section.empty() ? name : section + "." + name, value);
  }
  return keys;
}

// `keys` as JSON text; bytes that are not UTF-8 are replaced (a path may hold any byte).
std::string to_json_text(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The first index at which `mine` differs from `root`'s keys, INT32_MAX when they agree.
int32_t first_difference(const KeyValues& root, const KeyValues& mine) {
  const size_t n = std::max(root.size(), mine.size());
  for (size_t i = 0; i < n; ++i)
    if (i >= root.size() || i >= mine.size() || root[i] != mine[i]) return int32_t(i);
  return INT32_MAX;
}

}  // namespace

uint64_t fnv1a64(const std::string& text) {
  uint64_t h = 14695981039346656037ull;
  for (const unsigned char c : text) h = (h ^ c) * 1099511628211ull;
  return h;
}

std::string broadcast_text(Communicator& comm, const std::string& text, int root) {
  if (comm.size() == 1) return text;
  // Collectives carry i32 or f32: the length, then the bytes packed four to a word.
  int32_t length = comm.rank() == root ? int32_t(std::min<size_t>(text.size(), INT32_MAX / 2)) : 0;
  comm.broadcast(host_tensor(std::span(&length, 1)), root, "job.text_length");
  std::vector<int32_t> words((size_t(length) + 3) / 4 + 1, 0);
  if (comm.rank() == root)
    for (size_t i = 0; i < size_t(length); ++i)
      words[i / 4] = int32_t(uint32_t(words[i / 4]) | uint32_t(uint8_t(text[i])) << (8 * (i % 4)));
  comm.broadcast(host_tensor(std::span(words)), root, "job.text");
  std::string out(size_t(length), '\0');
  for (size_t i = 0; i < out.size(); ++i)
    out[i] = char(uint8_t(uint32_t(words[i / 4]) >> (8 * (i % 4))));
  return out;
}

void run_on_root_or_fail_together(Communicator& comm, int root, const std::function<void()>& step) {
  std::string error;
  if (comm.rank() == root) {
    try {
      step();
    } catch (const Error& e) {
      error = e.what();
      // An empty message would read as success on the other ranks.
      if (error.empty()) error = "an error without a message";
    }
  }
  error = broadcast_text(comm, error, root);
  if (!error.empty()) fail("{}", error);
}

void run_everywhere_or_fail_together(Communicator& comm, const std::function<void()>& step) {
  std::string error;
  try {
    step();
  } catch (const Error& e) {
    error = e.what();
    if (error.empty()) error = "an error without a message";
  }
  if (comm.size() == 1) {
    if (!error.empty()) fail("{}", error);
    return;
  }
  // Who failed, one flag per rank; then the lowest of them says why.
  int32_t mine = error.empty() ? 0 : 1;
  std::vector<int32_t> failed(size_t(comm.size()), 0);
  comm.all_gather(host_tensor(std::span(failed)), host_tensor(std::span(&mine, 1)),
                  "job.failed_ranks");
  const auto first = std::find(failed.begin(), failed.end(), 1);
  if (first == failed.end()) return;
  fail("{}", broadcast_text(comm, error, int(first - failed.begin())));
}

void check_same_configuration(Communicator& comm, const std::string& resolved_toml,
                              const std::string& config_path) {
  if (comm.size() == 1) return;
  // Through JSON like rank 0's keys below, so that both sides are compared in one form.
  const KeyValues keys =
      nlohmann::json::parse(to_json_text(resolved_keys(resolved_toml))).get<KeyValues>();
  // The digest of each rank, gathered as two 32-bit halves: a fixed shape that ranks given
  // any two configurations exchange alike.
  const uint64_t digest = fnv1a64(resolved_toml);
  int32_t mine[2] = {int32_t(uint32_t(digest)), int32_t(uint32_t(digest >> 32))};
  std::vector<int32_t> all(2 * size_t(comm.size()));
  comm.all_gather(host_tensor(std::span(all)), host_tensor(std::span(mine)), "job.config_digest");
  bool same = true;
  for (size_t r = 1; r < size_t(comm.size()); ++r)
    same = same && all[2 * r] == all[0] && all[2 * r + 1] == all[1];
  if (same) return;
  // Every rank now knows of a difference. Rank 0's keys go to all; each finds where its own
  // first differ, and the rank with the earliest difference describes it for everyone.
  const nlohmann::json root = nlohmann::json::parse(
      broadcast_text(comm, to_json_text({{"path", config_path}, {"keys", keys}}), 0));
  const KeyValues root_keys = root["keys"].get<KeyValues>();
  int32_t at = first_difference(root_keys, keys);
  std::vector<int32_t> where(size_t(comm.size()));
  comm.all_gather(host_tensor(std::span(where)), host_tensor(std::span(&at, 1)),
                  "job.config_difference");
  int describer = 0;
  for (int r = 1; r < comm.size(); ++r)
    if (where[size_t(r)] < where[size_t(describer)]) describer = r;
  std::string what;
  if (comm.rank() == describer) {
    const size_t i = size_t(where[size_t(describer)]);
    auto value_of = [&](const KeyValues& kv, int rank, const std::string& path) {
      return i < kv.size() ? fmt::format("{} on rank {} ({})", shortened(kv[i].second), rank, path)
                           : fmt::format("absent on rank {} ({})", rank, path);
    };
    if (i >= std::max(keys.size(), root_keys.size()))
      what = "their resolved configurations differ";  // equal keys, another digest: no case yet
    else
      what =
          fmt::format("key '{}' is {} but {}", i < keys.size() ? keys[i].first : root_keys[i].first,
                      value_of(keys, comm.rank(), config_path),
                      value_of(root_keys, 0, root["path"].get<std::string>()));
  }
  what = broadcast_text(comm, what, describer);
  fail(
      "the ranks of this job were given different configurations: {}; every rank must run the "
      "same configuration file with the same --set, --resume and --init-from options",
      what);
}

}  // namespace bottle
