#pragma once
// The byte-level tokenizer of `bottle prepare`: a vocabulary of 256, token = byte value.
// Decoding maps each token back to its byte, so `bottle sample` prints text.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace bottle {

inline constexpr int32_t kByteVocabSize = 256;

std::vector<int32_t> byte_encode(std::string_view text);
// Errors (bottle::Error) name a token outside [0, 256).
std::string byte_decode(std::span<const int32_t> tokens);
char byte_decode(int32_t token);

// How often each byte value occurs.
std::array<uint64_t, 256> byte_counts(std::string_view text);
// −Σ p log p (natural log) of the byte frequencies: the loss, in nats per token, of the best
// model that ignores context; 0 for no data.
double unigram_entropy(const std::array<uint64_t, 256>& counts);
inline double byte_unigram_entropy(std::string_view text) {
  return unigram_entropy(byte_counts(text));
}

}  // namespace bottle
