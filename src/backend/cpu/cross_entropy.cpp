// Cross-entropy over the vocabulary: the whole-row softmax and its gradient, and the
// vocabulary-parallel pieces of §4 (row statistics, rescaled partial sums, losses, the
// sharded gradient). One thread per row; bf16 logits and their gradients are widened one row
// at a time into the thread's slab and rounded back once. Statistics are fp32 (§18).
#include "backend/cpu/cpu_backend.h"

namespace bottle::cpu {

void CpuBackend::do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                          Tensor targets) {
  const int64_t n = logits.rows(), v = logits.cols();
  const Slabs slabs(slab_ws_, kLogitSlabs, v, any_bf16({probs, logits}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window lw(logits, Access::read, slabs.get(0)), pw(probs, Access::write, slabs.get(1));
    const float* li = lw.at(i * v, v);
    float* pi = pw.at(i * v, v);
    const kmath::SoftmaxState st = softmax_in_place(pi, li, v);
    store(losses, i, kmath::cross_entropy_loss(st.sumexp, st.max, li[targets.i32()[i]]));
  }
}

// The backward kernels write dlogits, their only producer (backend.h).
void CpuBackend::do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                           float scale) {
  const int64_t n = probs.rows(), v = probs.cols();
  const Slabs slabs(slab_ws_, kLogitSlabs, v, any_bf16({dlogits, probs}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window pw(probs, Access::read, slabs.get(0)), dw(dlogits, Access::write, slabs.get(1));
    const float* pi = pw.at(i * v, v);
    float* di = dw.at(i * v, v);
    for_row_with_target(v, targets.i32()[i], [=](int64_t j, bool is_target) {
      di[j] = kmath::cross_entropy_dlogit(pi[j], is_target, scale);
    });
  }
}

void CpuBackend::do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  const int64_t n = logits.rows(), v = logits.cols();
  const Slabs slabs(slab_ws_, 1, v, logits.dtype == DType::bf16);  // within kLogitSlabs
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window lw(logits, Access::read, slabs.get(0));
    const float* li = lw.at(i * v, v);
    float mx = li[0];
#pragma omp simd reduction(max : mx)
    for (int64_t j = 1; j < v; ++j) mx = std::max(mx, li[j]);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int64_t j = 0; j < v; ++j) sum += fast_exp(li[j] - mx);
    // The vectorized max may skip a NaN logit (it depends on the lanes); the sum never does.
    store(max, i, std::isnan(sum) ? sum : mx);
    store(sumexp, i, sum);
  }
}

void CpuBackend::do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                                 Tensor sumexp, Tensor targets, int64_t first,
                                                 float scale) {
  const int64_t n = logits.rows(), v = logits.cols();
  const Slabs slabs(slab_ws_, kLogitSlabs, v, any_bf16({dlogits, logits}));
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    Window lw(logits, Access::read, slabs.get(0)), dw(dlogits, Access::write, slabs.get(1));
    const float* li = lw.at(i * v, v);
    float* di = dw.at(i * v, v);
    const float mx = load(max, i), inv_sumexp = 1.0f / load(sumexp, i);
    // The target may lie in another rank's shard, outside [0, v).
    for_row_with_target(v, int64_t(targets.i32()[i]) - first, [=](int64_t j, bool is_target) {
      di[j] = kmath::cross_entropy_dlogit(fast_exp(li[j] - mx) * inv_sumexp, is_target, scale);
    });
  }
}

void CpuBackend::do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                                 Tensor local_sumexp, Tensor local_max, Tensor max,
                                                 Tensor logits, Tensor targets, int64_t first) {
  const int64_t n = logits.rows(), v = logits.cols();
  for (int64_t i = 0; i < n; ++i) {
    // sumexp may alias local_max: local_max[i] is read before sumexp[i] is written.
    store(sumexp, i,
          kmath::rescaled_sumexp(load(local_sumexp, i), load(local_max, i), load(max, i),
                                 [](float x) { return std::exp(x); }));
    const int64_t t = int64_t(targets.i32()[i]) - first;
    store(target_logit, i, t >= 0 && t < v ? load(logits, i * v + t) : 0.0f);
  }
}

void CpuBackend::do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp, Tensor target_logit,
                                               Tensor max) {
  for (int64_t i = 0; i < losses.numel(); ++i)
    store(losses, i,
          kmath::cross_entropy_loss(load(sumexp, i), load(max, i), load(target_logit, i)));
}

}  // namespace bottle::cpu
