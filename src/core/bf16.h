#pragma once
// bfloat16: the top 16 bits of an IEEE float32 (8 exponent bits, 7 mantissa bits). Every
// float → bf16 conversion in bottle rounds to nearest, ties to even, with the one formula of
// core/kernel_math.h, so that the reference backend is the exact oracle of what any other
// backend (the CUDA kernels included) stores.
#include <cstdint>

#include "core/kernel_math.h"

namespace bottle {

inline uint16_t bf16_from_float(float f) { return kmath::bf16_from_float(f); }
inline float bf16_to_float(uint16_t h) { return kmath::bf16_to_float(h); }

// f rounded to the nearest bf16, as a float.
inline float round_to_bf16(float f) { return bf16_to_float(bf16_from_float(f)); }

}  // namespace bottle
