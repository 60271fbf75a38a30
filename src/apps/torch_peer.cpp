#include "apps/torch_peer.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>

#include "apps/subprocess.h"
#include "core/error.h"

namespace bottle {

std::string torch_script_path() {
  if (const char* env = std::getenv("BOTTLE_TORCH_SCRIPT")) return env;
  return BOTTLE_SOURCE_DIR "/tools/torch_reference.py";
}

TorchStep run_torch_bench(const std::string& checkpoint, const std::string& shard, int64_t batch,
                          int64_t seq, int64_t steps, int64_t warmup, int threads) {
  const std::string out = run_command(
      fmt::format("/usr/bin/python3 '{}' --checkpoint '{}' --data '{}' --batch {} --seq {} "
                  "--bench --steps {} --warmup {} --threads {}",
                  torch_script_path(), checkpoint, shard, batch, seq, steps, warmup, threads));
  // The JSON result is the last line that parses.
  nlohmann::json j;
  size_t end = out.size();
  while (end > 0) {
    const size_t begin = out.rfind('\n', end - 1);
    const std::string line = out.substr(begin == std::string::npos ? 0 : begin + 1,
                                        end - (begin == std::string::npos ? 0 : begin + 1));
    if (!line.empty() && line[0] == '{') {
      j = nlohmann::json::parse(line, nullptr, false);
      if (!j.is_discarded()) break;
    }
    if (begin == std::string::npos) break;
    end = begin;
  }
  BOTTLE_CHECK(j.is_object() && j.contains("ms_per_step_median"),
               "PyTorch peer printed no result:\n{}", out);
  auto text = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string("?");
  };
  return {j["ms_per_step_median"].get<double>(),
          j["ms_per_step_min"].get<double>(),
          j["ms_per_step_max"].get<double>(),
          text("torch"),
          text("blas_core"),
          text("blas_core_source")};
}

}  // namespace bottle
