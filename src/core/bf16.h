#pragma once
// bfloat16: the top 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits). Every
// float → bf16 conversion in bottle rounds to nearest, ties to even, here, so that the
// reference backend is the exact oracle of what any other backend stores.
#include <bit>
#include <cstdint>

namespace bottle {

inline uint16_t bf16_from_float(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  // A NaN stays a (quiet) NaN: rounding could carry its payload into the exponent.
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);
  // Adding 0x7fff plus the kept part's lowest bit rounds half-way cases to the even one;
  // an overflow rounds to infinity, as IEEE rounding does.
  return uint16_t((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float bf16_to_float(uint16_t h) { return std::bit_cast<float>(uint32_t(h) << 16); }

// f rounded to the nearest bf16, as a float.
inline float round_to_bf16(float f) { return bf16_to_float(bf16_from_float(f)); }

}  // namespace bottle
