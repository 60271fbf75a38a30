#include "data/byte_tokenizer.h"

#include <cmath>

#include "core/error.h"

namespace bottle {

std::vector<int32_t> byte_encode(std::string_view text) {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

char byte_decode(int32_t token) {
  BOTTLE_CHECK(token >= 0 && token < kByteVocabSize,
               "token {} is not a byte (the byte tokenizer's vocabulary is 0..255)", token);
  return static_cast<char>(static_cast<unsigned char>(token));
}

std::string byte_decode(std::span<const int32_t> tokens) {
  std::string text(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) text[i] = byte_decode(tokens[i]);
  return text;
}

std::array<uint64_t, 256> byte_counts(std::string_view text) {
  std::array<uint64_t, 256> counts{};
  for (char c : text) ++counts[static_cast<unsigned char>(c)];
  return counts;
}

double unigram_entropy(const std::array<uint64_t, 256>& counts) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  if (total == 0) return 0.0;
  double h = 0.0;
  for (uint64_t c : counts) {
    if (c == 0) continue;
    const double p = double(c) / double(total);
    h -= p * std::log(p);
  }
  return h;
}

}  // namespace bottle
