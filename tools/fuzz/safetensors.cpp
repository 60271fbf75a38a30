// libFuzzer target: a whole safetensors file (8-byte length, JSON header, data) through the
// header reader that SafeTensorsReader uses. bottle::Error is the expected answer to bad input;
// anything else (another exception, a crash, a sanitizer report) is a bug.
#include "io/safetensors.h"

#include <cstdint>
#include <sstream>
#include <string>

#include "core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::istringstream in(std::string(reinterpret_cast<const char*>(data), size));
  try {
    bottle::read_safetensors_header(in, size, "fuzz.safetensors");
  } catch (const bottle::Error&) {
  }
  return 0;
}
