// Rotary embedding (HF rotate-half) in place, forward and backward (the inverse rotation),
// from a cached table of cos/sin per (position, frequency). A bf16 x is widened one
// (batch, position) row of every head at a time and rounded back once.
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {

const RopeTable& CpuBackend::rope_table(int64_t S, int64_t hd, float theta) {
  std::lock_guard lock(rope_mutex_);
  auto key = std::make_tuple(S, hd, theta);
  auto it = rope_tables_.find(key);
  if (it != rope_tables_.end()) return it->second;
  RopeTable t;
  const int64_t half = hd / 2;
  t.cos.resize(S * half);  // [S, hd/2]
  t.sin.resize(S * half);  // [S, hd/2]
  for (int64_t s = 0; s < S; ++s)
    for (int64_t i = 0; i < half; ++i) {
      // Same expression as HF: inv_freq in fp32, then the product in fp32.
      const float inv_freq = kmath::rope_inv_freq(i, hd, theta);
      const float angle = float(s) * inv_freq;
      t.cos[s * half + i] = std::cos(angle);
      t.sin[s * half + i] = std::sin(angle);
    }
  return rope_tables_.emplace(key, std::move(t)).first->second;
}

void CpuBackend::rope(Tensor x, float theta, float direction) {
  const int64_t B = x.shape[0], S = x.shape[1], heads = x.shape[2], hd = x.shape[3], half = hd / 2,
                row = heads * hd;
  const RopeTable& t = rope_table(S, hd, theta);
  const Slabs slabs(slab_ws_, kRopeSlabs, row, x.dtype == DType::bf16);
#pragma omp parallel for schedule(static)
  for (int64_t bs = 0; bs < B * S; ++bs) {
    const int64_t s = bs % S;
    const float* cs = t.cos.data() + s * half;
    const float* sn = t.sin.data() + s * half;
    Window xw(x, Access::read_write, slabs.get(0));
    float* xr = xw.at(bs * row, row);  // [heads, hd]
    for (int64_t h = 0; h < heads; ++h) {
      float* v = xr + h * hd;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        float x1 = v[i], x2 = v[i + half];
        kmath::rope_rotate(x1, x2, cs[i], direction * sn[i]);
        v[i] = x1;
        v[i + half] = x2;
      }
    }
  }
}

void CpuBackend::do_rope_forward(Tensor q, Tensor k, float theta) {
  rope(q, theta, 1.0f);
  rope(k, theta, 1.0f);
}
void CpuBackend::do_rope_backward(Tensor dq, Tensor dk, float theta) {
  rope(dq, theta, -1.0f);
  rope(dk, theta, -1.0f);
}

}  // namespace bottle::cpu
