// Rotary embedding (HF rotate-half), in place on x [B, S, heads, hd]: pair i of every head
// vector, (x[i], x[i + hd/2]) for i < hd/2, turns by the angle pos · inv_freq(i), pos = s.
#include "core/cuda/common.cuh"

namespace bottle::cuda {
namespace {

constexpr int kThreads = 256;

// The frequencies of up to 128 pairs (hd <= 256, the attention kernels' limit), computed on
// the host and passed as a kernel parameter (512 bytes). Why the host: the angle is
// s · inv_freq with s up to the sequence length, so one ulp of powf in inv_freq becomes s ulps
// in the angle; the host's powf is the one the CPU backend uses, so the GPU's angles match
// the CPU's bit for bit. Longer heads compute inv_freq on the device (its powf may differ by
// an ulp or two).
constexpr int64_t kMaxHostPairs = 128;
struct InvFreqs {
  float v[kMaxHostPairs];
};

// One thread per pair: element p of the B·S·heads·(hd/2) pairs. Within a head vector the
// threads of pairs i read x[i] and x[i + hd/2], two coalesced runs.
__global__ void rope_kernel(Array x,          // [batch, seq, heads, hd]
                            ConstArray x_in,  // x, read
                            int64_t pairs, int64_t seq, int64_t heads, int64_t hd, float theta,
                            float direction, InvFreqs freqs, bool host_freqs) {
  const int64_t half = hd / 2;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t p = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; p < pairs; p += stride) {
    const int64_t vec = p / half, i = p - vec * half;  // vec = (b · seq + s) · heads + h
    const int64_t s = (vec / heads) % seq;
    const float inv_freq = host_freqs ? freqs.v[i] : kmath::rope_inv_freq(i, hd, theta);
    // As the CPU backend: the angle in fp32, then accurate cosf/sinf (not __cosf/__sinf).
    const float angle = float(s) * inv_freq;
    const float cos_a = cosf(angle), sin_a = direction * sinf(angle);
    const int64_t at = vec * hd + i;
    float x1 = load(x_in, at), x2 = load(x_in, at + half);
    kmath::rope_rotate(x1, x2, cos_a, sin_a);
    store(x, at, x1);
    store(x, at + half, x2);
  }
}

}  // namespace

void rope(cudaStream_t stream, Array x, int64_t batch, int64_t seq, int64_t heads, int64_t hd,
          float theta, float direction) {
  const int64_t pairs = batch * seq * heads * (hd / 2);
  if (pairs <= 0) return;
  InvFreqs freqs{};
  const bool host_freqs = hd / 2 <= kMaxHostPairs;
  if (host_freqs)
    for (int64_t i = 0; i < hd / 2; ++i) freqs.v[i] = kmath::rope_inv_freq(i, hd, theta);
  rope_kernel<<<grid_for(pairs, kThreads), kThreads, 0, stream>>>(
      x, ConstArray(x), pairs, seq, heads, hd, theta, direction, freqs, host_freqs);
}

}  // namespace bottle::cuda
