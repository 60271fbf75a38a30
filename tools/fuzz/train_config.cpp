// libFuzzer target: a TOML training configuration, and the --set overrides that follow a line
// "#--set" (one per line), through the parser that `bottle train` uses. bottle::Error is the
// expected answer to bad input; anything else is a bug.
#include "train/train_config.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  const std::string marker = "\n#--set\n";
  if (const size_t at = text.find(marker); at != std::string::npos) {
    std::string rest = text.substr(at + marker.size());
    text.resize(at);
    for (size_t begin = 0; begin <= rest.size();) {
      const size_t end = std::min(rest.find('\n', begin), rest.size());
      if (end > begin) overrides.push_back(rest.substr(begin, end - begin));
      begin = end + 1;
    }
  }
  try {
    bottle::parse_train_config_string(text, "fuzz.toml", overrides);
  } catch (const bottle::Error&) {
  }
  return 0;
}
