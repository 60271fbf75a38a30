// libFuzzer target: a whole llm.c token shard through the shard reader. bottle::Error is the
// expected answer to bad input; anything else is a bug.
#include "io/token_shard.h"

#include <cstdint>
#include <sstream>
#include <string>

#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    bottle::read_token_shard(in, size, "fuzz.bin");
  } catch (const bottle::Error&) {
  }
  return 0;
}
