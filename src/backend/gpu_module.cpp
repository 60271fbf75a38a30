#include "backend/gpu_module.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include "gpu_module_abi.h"

namespace bottle {

namespace {

namespace fs = std::filesystem;

// The folders to look in, in order, each with what it is for messages.
std::vector<std::pair<fs::path, std::string>> search_folders() {
  if (const char* dir = std::getenv("BOTTLE_MODULE_DIR"); dir && *dir)
    return {{fs::path(dir), "BOTTLE_MODULE_DIR"}};
  std::vector<std::pair<fs::path, std::string>> folders;
  std::error_code ec;
  const fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) folders.emplace_back(self.parent_path(), "beside " + self.string());
  const fs::path built(BOTTLE_MODULE_BUILD_DIR);
  if (folders.empty() || !fs::equivalent(folders.front().first, built, ec))
    folders.emplace_back(built, "the build folder");
  return folders;
}

GpuModule open_module(std::string_view file, const char* entry) {
  GpuModule module;
  std::string looked;
  for (const auto& [folder, what] : search_folders()) {
    const fs::path path = folder / file;
    module.path = path.string();
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      looked += fmt::format("{}{} ({})", looked.empty() ? "" : ", ", folder.string(), what);
      continue;
    }
    // RTLD_NOW: a missing CUDA library or bottle symbol is reported here, by dlerror, and not
    // as a crash at the first call. RTLD_LOCAL: nothing else binds to the module's symbols.
    void* handle = ::dlopen(module.path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle) {
      const char* error = ::dlerror();
      module.why = fmt::format("cannot load {}: {}", module.path, error ? error : "unknown error");
      return module;
    }
    const auto get = reinterpret_cast<GpuModuleEntry>(::dlsym(handle, entry));
    if (!get) {
      module.why =
          fmt::format("{} has no entry point {}: it is not a bottle module", module.path, entry);
      return module;
    }
    const void* api = get();
    // The table's first field is the module's interface fingerprint.
    const char* abi = api ? *static_cast<const char* const*>(api) : nullptr;
    if (!abi || std::string_view(abi) != BOTTLE_GPU_MODULE_ABI) {
      module.why = fmt::format(
          "{} was built from other sources than this executable (interface {}, this one's {}): "
          "rebuild them together, or use the module of this build",
          module.path, abi ? abi : "unknown", BOTTLE_GPU_MODULE_ABI);
      return module;
    }
    module.api = api;
    return module;
  }
  module.why = fmt::format("{} was not found in {}", file, looked);
  return module;
}

}  // namespace

const GpuModule& open_gpu_module(std::string_view file, const char* entry) {
  // One attempt per module and process: the answer (and dlerror's words) stays the same, and a
  // failed dlopen is not retried at every call.
  static std::mutex mutex;
  static std::map<std::string, GpuModule, std::less<>> opened;
  const std::lock_guard lock(mutex);
  if (const auto it = opened.find(file); it != opened.end()) return it->second;
  return opened.emplace(std::string(file), open_module(file, entry)).first->second;
}

}  // namespace bottle
