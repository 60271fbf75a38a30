// Rotary embedding (HF rotate-half), in place on q [B, S, H, hd] and k [B, S, Hkv, hd], angles
// in double.
#include <cmath>

#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

namespace {

// sign = +1 rotates by +angle (forward), -1 by -angle (backward, the inverse).
void rope(Tensor x, float theta, double sign, const char* kernel) {
  need_f32(kernel, {x});
  BOTTLE_CHECK(x.shape.rank == 4 && x.shape[3] % 2 == 0,
               "reference backend: {}: x must be [B,S,heads,hd] with even hd, got {}", kernel,
               x.shape.str());
  const int64_t B = x.shape[0], S = x.shape[1], heads = x.shape[2], hd = x.shape[3];
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      for (int64_t h = 0; h < heads; ++h) {
        float* xv = x.f32() + ((b * S + s) * heads + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double inv_freq = std::pow(double(theta), -2.0 * double(i) / double(hd));
          const double angle = sign * double(s) * inv_freq;
          const double c = std::cos(angle), sn = std::sin(angle);
          const double x1 = xv[i], x2 = xv[i + half];
          xv[i] = float(x1 * c - x2 * sn);
          xv[i + half] = float(x2 * c + x1 * sn);
        }
      }
    }
  }
}

}  // namespace

void ReferenceBackend::do_rope_forward(Tensor q, Tensor k, float theta) {
  rope(q, theta, +1.0, "rope_forward");
  rope(k, theta, +1.0, "rope_forward");
}

void ReferenceBackend::do_rope_backward(Tensor dq, Tensor dk, float theta) {
  rope(dq, theta, -1.0, "rope_backward");
  rope(dk, theta, -1.0, "rope_backward");
}

}  // namespace bottle
