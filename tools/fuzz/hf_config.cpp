// libFuzzer target: the text of an HF config.json through the reader a checkpoint load uses.
// bottle::Error is the expected answer to bad input; anything else is a bug.
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    bottle::parse_hf_config(std::string_view(reinterpret_cast<const char*>(data), size),
                            "fuzz/config.json");
  } catch (const bottle::Error&) {
  }
  return 0;
}
