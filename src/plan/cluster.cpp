#include "plan/cluster.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "cluster_a100_perlmutter.h"  // generated from clusters/*.toml
#include "cluster_h100.h"
#include "cluster_h200.h"
#include "core/error.h"
#include "io/file_read.h"

namespace bottle {
namespace {

struct Preset {
  const char* name;
  std::string_view text;
};
const Preset kPresets[] = {{"a100-perlmutter", kCluster_a100_perlmutter},
                           {"h100", kCluster_h100},
                           {"h200", kCluster_h200}};

// What a number of a cluster file may be: in [min, max], or also 0 where 0 means "not
// measured" or "none". Every number is bounded, so that no price is infinite or NaN (a kernel
// overhead of 1e308 µs made rows of -nan and inf): rates and bandwidths from 10^-6 (a very slow
// machine) to 10^6 (a thousand times today's GPUs), times up to a second per launch or step.
struct Range {
  double min, max;
  const char* unit;
  bool zero_allowed = false;
};
constexpr Range kRate{1e-6, 1e6, "TFLOP/s"};
constexpr Range kMeasuredRate{1e-6, 1e6, "TFLOP/s; 0: not measured", true};
constexpr Range kBandwidth{1e-6, 1e6, "GB/s"};
constexpr Range kMeasuredBandwidth{1e-6, 1e6, "GB/s; 0: not measured", true};
constexpr Range kMemory{1e-6, 1e6, "GiB"};
constexpr Range kMicroseconds{0, 1e6, "µs"};
constexpr Range kGpus{1, 1e6, "GPUs"};
constexpr Range kMessageBytes{0, 1e12, "bytes"};
constexpr Range kShare{1e-3, 1, "a share of the peak"};
constexpr Range kSlowdown{0, 1e3, "times longer"};

// Every key of a cluster file: where it goes, whether it may be left out, and its range.
struct Key {
  const char* path;
  enum Kind { text, number, count } kind;
  bool required;
  std::function<void(ClusterSpec&, double, const std::string&)> set;
  std::function<std::string(const ClusterSpec&)> get;
  Range range{};
};

// The shortest text that reads back as the same double, always with a '.' or an exponent, so
// that TOML reads it as a float.
std::string number_text(double v) {
  std::string t = fmt::format("{}", v);
  if (t.find_first_of(".eEn") == std::string::npos) t += ".0";
  return t;
}

const std::vector<Key>& keys() {
  auto num = [](const char* path, double ClusterSpec::*field, Range range, bool required = true) {
    return Key{path,
               Key::number,
               required,
               [field](ClusterSpec& s, double v, const std::string&) { s.*field = v; },
               [field](const ClusterSpec& s) { return number_text(s.*field); },
               range};
  };
  auto link = [](const char* path, Link ClusterSpec::*link, double Link::*field, Range range) {
    return Key{
        path,
        Key::number,
        true,
        [link, field](ClusterSpec& s, double v, const std::string&) { (s.*link).*field = v; },
        [link, field](const ClusterSpec& s) { return number_text((s.*link).*field); },
        range};
  };
  // Written as what it prices: latency_us where it was not given.
  auto small_latency = [](const char* path, Link ClusterSpec::*link) {
    return Key{
        path,
        Key::number,
        false,
        [link](ClusterSpec& s, double v, const std::string&) { (s.*link).small_latency_us = v; },
        [link](const ClusterSpec& s) { return number_text((s.*link).step_latency_us(true)); },
        kMicroseconds};
  };
  auto str = [](const char* path, std::string ClusterSpec::*field) {
    return Key{path, Key::text, true,
               [field](ClusterSpec& s, double, const std::string& v) { s.*field = v; },
               [field](const ClusterSpec& s) { return nlohmann::json(s.*field).dump(); }};
  };
  using C = ClusterSpec;
  static const std::vector<Key> all{
      str("cluster.name", &C::name),
      str("cluster.description", &C::description),
      str("gpu.name", &C::gpu_name),
      num("gpu.bf16_tflops", &C::bf16_tflops, kRate),
      num("gpu.fp32_tflops", &C::fp32_tflops, kRate),
      num("gpu.memory_gib", &C::memory_gib, kMemory),
      num("gpu.memory_bandwidth_gbs", &C::memory_bandwidth_gbs, kBandwidth),
      num("gpu.kernel_overhead_us", &C::kernel_overhead_us, kMicroseconds),
      num("gpu.attention_tflops", &C::attention_tflops, kMeasuredRate, false),
      num("gpu.gemm_bandwidth_gbs", &C::gemm_bandwidth_gbs, kMeasuredBandwidth, false),
      Key{"node.gpus", Key::count, true,
          [](ClusterSpec& s, double v, const std::string&) { s.gpus_per_node = int(v); },
          [](const ClusterSpec& s) { return std::to_string(s.gpus_per_node); }, kGpus},
      link("links.intra_node.bandwidth_gbs", &C::intra_node, &Link::bandwidth_gbs, kBandwidth),
      link("links.intra_node.latency_us", &C::intra_node, &Link::latency_us, kMicroseconds),
      small_latency("links.intra_node.small_latency_us", &C::intra_node),
      link("links.inter_node.bandwidth_gbs", &C::inter_node, &Link::bandwidth_gbs, kBandwidth),
      link("links.inter_node.latency_us", &C::inter_node, &Link::latency_us, kMicroseconds),
      small_latency("links.inter_node.small_latency_us", &C::inter_node),
      num("nccl.base_latency_us", &C::nccl_base_latency_us, kMicroseconds),
      num("nccl.small_message_bytes", &C::small_message_bytes, kMessageBytes, false),
      num("efficiency.gemm", &C::gemm_efficiency, kShare),
      num("efficiency.bandwidth", &C::bandwidth_efficiency, kShare),
      num("overlap.compute_slowdown", &C::overlap_compute_slowdown, kSlowdown, false),
      num("overlap.call_slowdown", &C::overlap_call_slowdown, kSlowdown, false),
  };
  return all;
}

// "must be in [1e-06, 1e+06] (GB/s)", "must be 0 or in [...]".
std::string range_text(const Range& r) {
  return fmt::format("must be {}in [{:g}, {:g}] ({})", r.zero_allowed ? "0 or " : "", r.min, r.max,
                     r.unit);
}

}  // namespace

std::vector<std::string> cluster_presets() {
  std::vector<std::string> names;
  for (const Preset& p : kPresets) names.emplace_back(p.name);
  return names;
}

ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    fail("{}: TOML syntax error at line {}, column {}: {}", source, e.source().begin.line,
         e.source().begin.column, e.description());
  }
  std::set<std::string> known;
  for (const Key& k : keys()) known.insert(k.path);
  // Unknown keys are refused: a misspelt one would otherwise leave its default in place.
  std::function<void(const toml::table&, const std::string&)> walk = [&](const toml::table& t,
                                                                         const std::string& at) {
    for (const auto& [name, node] : t) {
      const std::string path =
          at.empty() ? std::string(name.str()) : at + "." + std::string(name.str());
      if (const toml::table* sub = node.as_table()) {
        walk(*sub, path);
      } else if (!known.count(path)) {
        fail("{}: unknown key '{}' (a cluster file has: {})", source, path, fmt::join(known, ", "));
      }
    }
  };
  walk(root, "");
  ClusterSpec spec;
  spec.source = source;
  for (const Key& k : keys()) {
    const auto node = root.at_path(k.path);
    if (!node) {
      BOTTLE_CHECK(!k.required, "{}: key '{}' is missing", source, k.path);
      continue;
    }
    if (k.kind == Key::text) {
      const auto v = node.value<std::string>();
      BOTTLE_CHECK(v.has_value(), "{}: key '{}' must be a string", source, k.path);
      k.set(spec, 0, *v);
      continue;
    }
    const auto v = node.value<double>();
    BOTTLE_CHECK(v.has_value(), "{}: key '{}' must be a number", source, k.path);
    const Range& r = k.range;
    BOTTLE_CHECK((*v >= r.min && *v <= r.max) || (*v == 0 && r.zero_allowed),
                 "{}: key '{}' {}, got {}", source, k.path, range_text(r), *v);
    if (k.kind == Key::count)
      BOTTLE_CHECK(*v == std::floor(*v), "{}: key '{}' must be a whole number of GPUs, got {}",
                   source, k.path, *v);
    k.set(spec, *v, {});
  }
  return spec;
}

ClusterSpec load_cluster(const std::string& preset_or_path) {
  for (const Preset& p : kPresets)
    if (preset_or_path == p.name)
      return parse_cluster(std::string(p.text), fmt::format("preset {}", p.name));
  namespace fs = std::filesystem;
  std::error_code ec;
  // Anything that exists is taken as the cluster file, which is then refused by what it is (a
  // FIFO, a device, too large) rather than as an unknown preset.
  BOTTLE_CHECK(fs::exists(fs::symlink_status(preset_or_path, ec)),
               "--cluster '{}' is neither a preset ({}) nor a cluster file", preset_or_path,
               fmt::join(cluster_presets(), ", "));
  return parse_cluster(read_bounded_file(preset_or_path, "the cluster file", kMaxConfigFileBytes),
                       preset_or_path);
}

std::string cluster_to_toml(const ClusterSpec& spec, const std::string& comment) {
  std::string out;
  std::istringstream lines(comment);
  for (std::string line; std::getline(lines, line);) out += "# " + line + "\n";
  std::string table;
  for (const Key& k : keys()) {
    const std::string path = k.path;
    const auto dot = path.rfind('.');
    const std::string section = path.substr(0, dot);
    if (section != table) {
      out += fmt::format("\n[{}]\n", section);
      table = section;
    }
    out += fmt::format("{} = {}\n", path.substr(dot + 1), k.get(spec));
  }
  return out;
}

}  // namespace bottle
