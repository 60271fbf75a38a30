// Cross-entropy over rows of logits: the whole vocabulary, and the pieces of the
// vocabulary-parallel loss (row statistics, partial sums, losses, gradients).
#include <cmath>

#include "backend/reference/common.h"
#include "backend/reference_backend.h"

namespace bottle {

using namespace reference;

void ReferenceBackend::do_cross_entropy_forward(Tensor losses, Tensor probs, Tensor logits,
                                                Tensor targets) {
  const char* k = "cross_entropy_forward";
  need_f32(k, {losses, probs, logits});
  need_dtype(k, targets, DType::i32);
  const int64_t n = logits.rows(), vocab = logits.cols();
  need_numel(k, targets, n, "targets");
  need_numel(k, losses, n, "losses");
  need_numel(k, probs, n * vocab, "probs");
  for (int64_t r = 0; r < n; ++r) {
    const float* lr = logits.f32() + r * vocab;
    const int32_t t = targets.i32()[r];
    BOTTLE_CHECK(t >= 0 && t < vocab, "reference backend: {}: target {} out of range [0, {})", k, t,
                 vocab);
    double mx = -INFINITY;
    for (int64_t j = 0; j < vocab; ++j) mx = lr[j] > mx ? lr[j] : mx;
    double sum = 0.0;
    for (int64_t j = 0; j < vocab; ++j) sum += std::exp(lr[j] - mx);
    const double lse = mx + std::log(sum);
    losses.f32()[r] = float(lse - lr[t]);
    for (int64_t j = 0; j < vocab; ++j) probs.f32()[r * vocab + j] = float(std::exp(lr[j] - lse));
  }
}

void ReferenceBackend::do_cross_entropy_backward(Tensor dlogits, Tensor probs, Tensor targets,
                                                 float scale) {
  const char* k = "cross_entropy_backward";
  need_f32(k, {dlogits, probs});
  need_dtype(k, targets, DType::i32);
  const int64_t n = probs.rows(), vocab = probs.cols();
  need_numel(k, targets, n, "targets");
  need_numel(k, dlogits, n * vocab, "dlogits");
  for (int64_t r = 0; r < n; ++r) {
    const int32_t t = targets.i32()[r];
    BOTTLE_CHECK(t >= 0 && t < vocab, "reference backend: {}: target {} out of range [0, {})", k, t,
                 vocab);
    for (int64_t j = 0; j < vocab; ++j) {
      const double onehot = j == t ? 1.0 : 0.0;
      dlogits.f32()[r * vocab + j] = float(double(scale) * (probs.f32()[r * vocab + j] - onehot));
    }
  }
}

void ReferenceBackend::do_logits_row_stats(Tensor max, Tensor sumexp, Tensor logits) {
  const char* k = "logits_row_stats";
  need_f32(k, {max, sumexp, logits});
  const int64_t n = logits.rows(), v = logits.cols();
  need_numel(k, max, n, "max");
  need_numel(k, sumexp, n, "sumexp");
  for (int64_t r = 0; r < n; ++r) {
    const float* lr = logits.f32() + r * v;
    // A NaN logit makes the row's max NaN (a plain comparison would skip it).
    double mx = -INFINITY;
    for (int64_t j = 0; j < v; ++j) mx = lr[j] > mx || std::isnan(lr[j]) ? lr[j] : mx;
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(lr[j] - mx);
    max.f32()[r] = float(mx);
    sumexp.f32()[r] = float(sum);
  }
}

void ReferenceBackend::do_cross_entropy_shard_partials(Tensor sumexp, Tensor target_logit,
                                                       Tensor local_sumexp, Tensor local_max,
                                                       Tensor max, Tensor logits, Tensor targets,
                                                       int64_t first) {
  const char* k = "cross_entropy_shard_partials";
  need_f32(k, {sumexp, target_logit, local_sumexp, local_max, max, logits});
  need_dtype(k, targets, DType::i32);
  const int64_t v = logits.cols();
  for (int64_t i = 0; i < logits.rows(); ++i) {
    sumexp.f32()[i] = float(double(local_sumexp.f32()[i]) *
                            std::exp(double(local_max.f32()[i]) - double(max.f32()[i])));
    const int64_t t = int64_t(targets.i32()[i]) - first;
    target_logit.f32()[i] = t >= 0 && t < v ? logits.f32()[i * v + t] : 0.0f;
  }
}

void ReferenceBackend::do_cross_entropy_shard_losses(Tensor losses, Tensor sumexp,
                                                     Tensor target_logit, Tensor max) {
  need_f32("cross_entropy_shard_losses", {losses, sumexp, target_logit, max});
  for (int64_t i = 0; i < losses.numel(); ++i)
    losses.f32()[i] = float(std::log(double(sumexp.f32()[i])) + double(max.f32()[i]) -
                            double(target_logit.f32()[i]));
}

void ReferenceBackend::do_cross_entropy_shard_backward(Tensor dlogits, Tensor logits, Tensor max,
                                                       Tensor sumexp, Tensor targets, int64_t first,
                                                       float scale) {
  const char* k = "cross_entropy_shard_backward";
  need_f32(k, {dlogits, logits, max, sumexp});
  need_dtype(k, targets, DType::i32);
  const int64_t n = logits.rows(), v = logits.cols();
  need_numel(k, dlogits, n * v, "dlogits");
  need_numel(k, targets, n, "targets");
  for (int64_t r = 0; r < n; ++r) {
    const int64_t target = int64_t(targets.i32()[r]) - first;
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(double(logits.f32()[r * v + j]) - max.f32()[r]) / sumexp.f32()[r];
      dlogits.f32()[r * v + j] = float(double(scale) * (p - (j == target ? 1.0 : 0.0)));
    }
  }
}

}  // namespace bottle
