#include "bench/torch_peer.h"

#include <cstdio>
#include <cstdlib>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/subprocess.h"
#include "core/error.h"

namespace bottle {

std::string torch_script_path() {
  if (const char* env = std::getenv("BOTTLE_TORCH_SCRIPT")) return env;
  return BOTTLE_SOURCE_DIR "/tools/torch_reference.py";
}

std::string torch_python(const std::string& device) {
  if (const char* env = std::getenv("BOTTLE_TORCH_PYTHON"); env && *env) return env;
  return device == "cpu" ? "/usr/bin/python3" : "python3";
}

namespace {

// The last non-empty line of `text`.
std::string last_line(const std::string& text) {
  size_t end = text.find_last_not_of("\n\r ");
  if (end == std::string::npos) return {};
  const size_t begin = text.rfind('\n', end);
  return text.substr(begin == std::string::npos ? 0 : begin + 1,
                     end + 1 - (begin == std::string::npos ? 0 : begin + 1));
}

}  // namespace

TorchStep run_torch_bench(const std::string& checkpoint, const std::string& shard, int64_t batch,
                          int64_t seq, int64_t steps, int64_t warmup, int threads,
                          const TorchBenchMode& mode) {
  const std::string command = fmt::format(
      "{}'{}' '{}' --checkpoint '{}' --data '{}' --batch {} --seq {} --bench --steps {} --warmup "
      "{} --threads {} --device {} --dtype {}{}",
      mode.best_blas ? "BOTTLE_OPENBLAS_BEST=1 " : "", torch_python(mode.device),
      torch_script_path(), checkpoint, shard, batch, seq, steps, warmup, threads, mode.device,
      mode.dtype, mode.compile ? " --compile" : "");
  const ShellResult r = run_shell(command + " 2>&1");
  const std::string& out = r.output;
  if (r.status != 0)
    fail("the PyTorch peer failed (status {}): {}\ncommand: {}\n{}", r.status, last_line(out),
         command, out.size() > 4000 ? out.substr(out.size() - 4000) : out);
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
  auto text = [&](const char* key, const char* absent = "?") {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string(absent);
  };
  TorchStep t;
  t.ms_median = j["ms_per_step_median"].get<double>();
  t.ms_min = j["ms_per_step_min"].get<double>();
  t.ms_max = j["ms_per_step_max"].get<double>();
  t.version = text("torch");
  t.blas_core = text("blas_core");
  t.blas_core_source = text("blas_core_source");
  t.blas_core_pinned = text("blas_core_pinned", "");
  auto number = [&](const char* key) {
    return j.contains(key) && j[key].is_number() ? j[key].get<double>()
                                                 : std::numeric_limits<double>::quiet_NaN();
  };
  t.first_loss = number("first_loss");
  t.first_grad_norm = number("first_grad_norm");
  t.device = text("device", mode.device.c_str());
  t.dtype = text("dtype", mode.dtype.c_str());
  t.attention = text("attention");
  t.gpu = text("gpu", "");
  t.compile_failed = j.value("compile_failed", false);
  t.compile_error = text("compile_error", "");
  return t;
}

}  // namespace bottle
