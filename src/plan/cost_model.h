#pragma once
// What `bottle plan` charges for the dry run's counts on a cluster (docs/design.md §22).
//   GEMM        flops / (gemm efficiency × peak of its dtype) + bytes / (bandwidth efficiency
//               × HBM bandwidth, or the GEMM bandwidth --calibrate measured) + the kernel
//               overhead: a roofline whose two terms add, so that a GEMM with a thin side (a
//               split rank r/t) pays for the operands it streams as well as for its FLOPs; its
//               efficiency falls as its arithmetic intensity (FLOPs per byte) does.
//   attention   its FLOPs at the measured attention rate, else as a GEMM's, plus its bytes.
//   other       memory-bound: bytes / (bandwidth efficiency × HBM bandwidth) + overhead.
//   collectives NCCL's ring and tree cost formulas, whichever is cheaper (as NCCL's tuner
//               picks), on the link the group crosses: inside a node when all its ranks are
//               on one, else the inter-node link; n ranks, S bytes, β = bandwidth efficiency ×
//               link bandwidth, α = the link's per-step latency, a = NCCL's base latency:
//                 all-reduce      ring a + 2(n−1)α + 2(n−1)/n·S/β;  tree a + 2⌈log₂n⌉α + 2S/β
//                 all-gather, reduce-scatter   a + (n−1)α + (n−1)/n·S/β   (S: the whole)
//                 broadcast       a + (n−1)α + S/β
//                 send            α + S/β   (a receive is the same transfer: not charged again)
#include "comm/counting_communicator.h"
#include "core/counting_backend.h"
#include "plan/cluster.h"

namespace bottle {

double gemm_seconds(const ClusterSpec& c, const GemmShape& g);
double kernel_seconds(const ClusterSpec& c, const std::string& kernel, const KernelCount& k);
// All kernels and GEMMs of `ops`, or those of one kind when `only_tail` is set: the tail
// kernels (the optimizer step and the gradient norm, once per step) apart from the rest.
double ops_seconds(const ClusterSpec& c, const OpCounts& ops, bool tail);
// Whether a kernel belongs to the step's tail (after the pipeline): AdamW, the norm, DP scaling.
bool is_tail_kernel(const std::string& kernel);

// The link a group of `ranks` ranks `stride` apart crosses, world ranks laid out TP fastest
// (process_groups.h) and node after node.
const Link& group_link(const ClusterSpec& c, int ranks, int stride);
double collective_seconds(const ClusterSpec& c, const CallShape& call, const Link& link);

}  // namespace bottle
