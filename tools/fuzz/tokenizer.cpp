// libFuzzer target: a tokenizer file as a user hands it to `prepare --tokenizer` (a
// tokenizer.json or a .tiktoken rank file), then a text through it. Input: [0] the kind (even:
// tokenizer.json, odd: .tiktoken), [1..2] the text's length L (little-endian), then L bytes of
// text, then the file. bottle::Error is the expected answer to a bad file; a crash, a hang or
// text that is not valid UTF-8 after repair is a bug.
#include "data/tokenizer.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "core/error.h"
#include "data/utf8.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const bool tiktoken = data[0] & 1;
  const size_t text_size = std::min<size_t>(size - 3, size_t(data[1]) | size_t(data[2]) << 8);
  const std::string_view raw(reinterpret_cast<const char*>(data) + 3, text_size);
  const std::string_view file(raw.data() + text_size, size - 3 - text_size);

  // The repair the text tokenizers rely on: valid UTF-8 out, and a fixed point.
  const std::string text = bottle::utf8_replace_invalid(raw);
  if (!bottle::utf8_valid(text) || bottle::utf8_replace_invalid(text) != text) __builtin_trap();

  static const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                           ("bottle-fuzz-tokenizer-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  const std::filesystem::path path = dir / (tiktoken ? "t.tiktoken" : "tokenizer.json");
  std::ofstream(path, std::ios::binary | std::ios::trunc)
      .write(file.data(), std::streamsize(file.size()));
  try {
    const auto tokenizer = bottle::load_tokenizer(path);
    const std::vector<int32_t> ids = tokenizer->encode(text);
    for (int32_t id : ids)
      if (id < 0 || id >= tokenizer->vocab_size()) __builtin_trap();
    if (!bottle::utf8_valid(tokenizer->decode(ids))) __builtin_trap();
  } catch (const bottle::Error&) {
  }
  return 0;
}
