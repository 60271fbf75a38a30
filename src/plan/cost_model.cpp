#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>

namespace bottle {
namespace {

double peak_flops(const ClusterSpec& c, bool bf16) {
  return (bf16 ? c.bf16_tflops : c.fp32_tflops) * 1e12 * c.gemm_efficiency;
}
double memory_seconds(const ClusterSpec& c, double bytes) {
  return bytes / (c.memory_bandwidth_gbs * 1e9 * c.bandwidth_efficiency);
}

}  // namespace

bool is_tail_kernel(const std::string& kernel) {
  return kernel == "adamw_update" || kernel == "sum_squares" || kernel == "scale";
}

double gemm_seconds(const ClusterSpec& c, const GemmShape& g) {
  const double operands = c.gemm_bandwidth_gbs > 0 ? g.bytes() / (c.gemm_bandwidth_gbs * 1e9)
                                                   : memory_seconds(c, g.bytes());
  return g.flops() / peak_flops(c, g.bf16()) + operands + c.kernel_overhead_us * 1e-6;
}

double kernel_seconds(const ClusterSpec& c, const std::string& kernel, const KernelCount& k) {
  double flops_seconds = 0;
  if (k.flops > 0) {
    const bool attention = kernel.starts_with("attention");
    // Attention runs in the activations' dtype: bf16 when its operands are (2 bytes per
    // element is all the counts keep, so the bf16 peak is taken for any bf16 run).
    flops_seconds = attention && c.attention_tflops > 0 ? k.flops / (c.attention_tflops * 1e12)
                                                        : k.flops / peak_flops(c, true);
  }
  return flops_seconds + memory_seconds(c, k.bytes) + double(k.calls) * c.kernel_overhead_us * 1e-6;
}

double ops_seconds(const ClusterSpec& c, const OpCounts& ops, bool tail) {
  double s = 0;
  if (!tail)
    for (const auto& [shape, calls] : ops.gemms) s += double(calls) * gemm_seconds(c, shape);
  for (const auto& [name, k] : ops.kernels)
    if (is_tail_kernel(name) == tail) s += kernel_seconds(c, name, k);
  return s;
}

const Link& group_link(const ClusterSpec& c, int ranks, int stride) {
  return int64_t(ranks - 1) * stride >= c.gpus_per_node ? c.inter_node : c.intra_node;
}

double collective_seconds(const ClusterSpec& c, const CallShape& call, const Link& link) {
  const double n = call.ranks, S = call.bytes();
  const double beta = link.bandwidth_gbs * 1e9 * c.bandwidth_efficiency;
  const double alpha = link.latency_us * 1e-6, base = c.nccl_base_latency_us * 1e-6;
  switch (call.kind) {
    case Collective::all_reduce: {
      const double ring = base + 2 * (n - 1) * alpha + 2 * (n - 1) / n * S / beta;
      const double tree = base + 2 * std::ceil(std::log2(n)) * alpha + 2 * S / beta;
      return std::min(ring, tree);
    }
    case Collective::all_gather:
    case Collective::reduce_scatter:
      return base + (n - 1) * alpha + (n - 1) / n * S / beta;
    case Collective::broadcast:
      return base + (n - 1) * alpha + S / beta;
    case Collective::send:
      return alpha + S / beta;
    case Collective::recv:
      return 0;
    case Collective::barrier:
      return base + 2 * (n - 1) * alpha;
  }
  return 0;
}

}  // namespace bottle
