#include "data/bpe_merges.h"

namespace bottle {

namespace {

std::string utf8_of(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else if (cp < 0x800) {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  } else {
    s += char(0xE0 | (cp >> 12));
    s += char(0x80 | ((cp >> 6) & 0x3F));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

}  // namespace

const std::array<std::string, 256>& byte_level_chars() {
  // Printable Latin-1 bytes stand for themselves; the others (controls, space, soft hyphen,
  // ...) take the code points from U+0100 on, in byte order.
  static const std::array<std::string, 256> chars = [] {
    std::array<std::string, 256> c;
    uint32_t extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      c[b] = utf8_of(printable ? b : 256 + extra++);
    }
    return c;
  }();
  return chars;
}

}  // namespace bottle
