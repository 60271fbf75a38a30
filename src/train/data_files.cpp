#include "train/data_files.h"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"

namespace bottle {

namespace fs = std::filesystem;

std::vector<std::string> resolve_data_files(const std::string& pattern) {
  std::vector<std::string> files;
  if (fs::is_directory(pattern)) {
    for (const auto& e : fs::directory_iterator(pattern))
      if (e.is_regular_file() && e.path().extension() == ".bin") files.push_back(e.path().string());
  } else if (fs::exists(pattern)) {
    files.push_back(pattern);
  } else {
    glob_t g{};
    if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
      for (size_t i = 0; i < g.gl_pathc; ++i) files.emplace_back(g.gl_pathv[i]);
    ::globfree(&g);
  }
  BOTTLE_CHECK(!files.empty(),
               "{}: no token shard found (a .bin file, a directory of them or a glob)", pattern);
  // Reading a FIFO or a device blocks or never ends.
  for (const std::string& file : files) {
    std::error_code ec;
    BOTTLE_CHECK(fs::is_regular_file(file, ec),
                 "{}: a token shard must be a regular file (not a FIFO, device or directory)",
                 file);
  }
  std::sort(files.begin(), files.end());
  return files;
}

}  // namespace bottle
