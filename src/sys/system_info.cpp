#include "sys/system_info.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <sstream>

namespace bottle {
namespace {

std::string cpuinfo_field(const std::string& field) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);)
    if (line.rfind(field, 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos && colon + 2 <= line.size()) return line.substr(colon + 2);
    }
  return {};
}

}  // namespace

std::string cpu_model() {
  const std::string model = cpuinfo_field("model name");
  return model.empty() ? "unknown" : model;
}

std::vector<std::string> cpu_vector_isa() {
  std::istringstream flags(cpuinfo_field("flags"));
  std::vector<std::string> have{std::istream_iterator<std::string>(flags), {}};
  std::vector<std::string> out;
  for (const char* isa : {"sse4_2", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512_vnni",
                          "avx512_bf16", "amx_tile", "amx_bf16"})
    if (std::find(have.begin(), have.end(), isa) != have.end()) out.emplace_back(isa);
  return out;
}

std::string compiled_isa() {
  std::vector<std::string> isa;
#ifdef __AVX__
  isa.emplace_back("avx");
#endif
#ifdef __AVX2__
  isa.emplace_back("avx2");
#endif
#ifdef __FMA__
  isa.emplace_back("fma");
#endif
#ifdef __AVX512F__
  isa.emplace_back("avx512f");
#endif
#ifdef __AVX512BW__
  isa.emplace_back("avx512bw");
#endif
#ifdef __AMX_TILE__
  isa.emplace_back("amx_tile");
#endif
  return isa.empty() ? "x86-64 baseline (sse2)" : fmt::format("x86-64 + {}", fmt::join(isa, ","));
}

std::string onednn_isa() {
  switch (dnnl_get_effective_cpu_isa()) {
    case dnnl_cpu_isa_sse41:
      return "sse41";
    case dnnl_cpu_isa_avx:
      return "avx";
    case dnnl_cpu_isa_avx2:
      return "avx2";
    case dnnl_cpu_isa_avx2_vnni:
      return "avx2_vnni";
    case dnnl_cpu_isa_avx512_mic:
      return "avx512_mic";
    case dnnl_cpu_isa_avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl_cpu_isa_avx512_core:
      return "avx512_core";
    case dnnl_cpu_isa_avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl_cpu_isa_avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl_cpu_isa_avx512_core_amx:
      return "avx512_core_amx";
    default:
      return "other";
  }
}

std::string cpu_summary() {
  const std::vector<std::string> isa = cpu_vector_isa();
  return fmt::format("{} ({}), oneDNN {}", cpu_model(),
                     isa.empty() ? std::string("no AVX") : fmt::format("{}", fmt::join(isa, ", ")),
                     onednn_isa());
}

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

}  // namespace bottle
