#include "plan/cost_model.h"

#include <algorithm>
#include <cmath>
#include <set>

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
  return kernel == "adamw_update" || kernel == "sum_squares" || kernel == "scale" ||
         kernel.starts_with("muon_");
}

double gemm_seconds(const ClusterSpec& c, const GemmShape& g) {
  const double operands = c.gemm_bandwidth_gbs > 0 ? g.bytes() / (c.gemm_bandwidth_gbs * 1e9)
                                                   : memory_seconds(c, g.bytes());
  return g.flops() / peak_flops(c, g.any_bf16()) + operands + c.kernel_overhead_us * 1e-6;
}

double kernel_seconds(const ClusterSpec& c, const std::string& kernel, const KernelCount& k,
                      bool bf16) {
  double flops_seconds = 0;
  if (k.flops > 0)
    flops_seconds = kernel.starts_with("attention") && c.attention_tflops > 0
                        ? k.flops / (c.attention_tflops * 1e12)
                        : k.flops / peak_flops(c, bf16);
  return flops_seconds + memory_seconds(c, k.bytes) + double(k.calls) * c.kernel_overhead_us * 1e-6;
}

double ops_seconds(const ClusterSpec& c, const OpCounts& ops, bool tail, bool bf16) {
  double s = 0;
  if (!tail)
    for (const auto& [shape, calls] : ops.gemms) s += double(calls) * gemm_seconds(c, shape);
  for (const auto& [name, k] : ops.kernels)
    if (is_tail_kernel(name) == tail) s += kernel_seconds(c, name, k, bf16);
  return s;
}

int nodes_spanned(const ClusterSpec& c, int64_t first, int ranks, int64_t stride) {
  std::set<int64_t> nodes;
  for (int i = 0; i < ranks; ++i) nodes.insert((first + i * stride) / c.gpus_per_node);
  return int(nodes.size());
}

double collective_seconds(const ClusterSpec& c, Collective kind, double bytes, int ranks,
                          int nodes) {
  const double n = ranks, N = nodes, S = bytes;
  const Link& bottleneck = nodes > 1 ? c.inter_node : c.intra_node;
  const double beta = bottleneck.bandwidth_gbs * 1e9 * c.bandwidth_efficiency;
  const bool small = S <= c.small_message_bytes;
  const double alpha = c.intra_node.step_latency_us(small) * 1e-6,
               alpha_net = c.inter_node.step_latency_us(small) * 1e-6;
  const double base = c.nccl_base_latency_us * 1e-6;
  // A ring of `steps` steps, `net_steps` of them crossing nodes.
  auto ring = [&](double steps, double net_steps) {
    return base + (steps - net_steps) * alpha + net_steps * alpha_net;
  };
  switch (kind) {
    case Collective::all_reduce:
    case Collective::barrier: {
      if (kind == Collective::barrier) return ring(2 * (n - 1), 2 * (N - 1));
      const double by_ring = ring(2 * (n - 1), 2 * (N - 1)) + 2 * (n - 1) / n * S / beta;
      const double by_tree =
          base + 2 * ((n / N - 1) * alpha + std::floor(std::log2(N)) * alpha_net) + 2 * S / beta;
      return std::min(by_ring, by_tree);
    }
    case Collective::all_gather:
    case Collective::reduce_scatter:
      return ring(n - 1, N - 1) + (n - 1) / n * S / beta;
    case Collective::broadcast:
      return base + (n - 1) * bottleneck.step_latency_us(small) * 1e-6 + S / beta;
    case Collective::send:
      return bottleneck.step_latency_us(small) * 1e-6 + S / beta;
    case Collective::recv:
      return 0;
  }
  return 0;
}

}  // namespace bottle
