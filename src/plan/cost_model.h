#pragma once
// What `bottle plan` charges for the dry run's counts on a cluster (docs/design.md §22).
//   GEMM        flops / (gemm efficiency × peak of its dtype) + bytes / (bandwidth efficiency
//               × HBM bandwidth, or the GEMM bandwidth --calibrate measured) + the kernel
//               overhead: a roofline whose two terms add, so that a GEMM with a thin side (a
//               split rank r/t) pays for the operands it streams as well as for its FLOPs; its
//               efficiency falls as its arithmetic intensity (FLOPs per byte) does.
//   attention   its FLOPs at the measured attention rate, else as a GEMM's in the run's
//               precision, plus its bytes.
//   other       memory-bound: bytes / (bandwidth efficiency × HBM bandwidth) + overhead.
//   collectives NCCL's cost model (its tuner, src/graph/tuning.cc, Simple protocol): ring and
//               tree, whichever is cheaper, as the tuner picks. n ranks on N nodes, S bytes,
//               β = bandwidth efficiency × the bottleneck link's bandwidth (inter-node when
//               N > 1), a = NCCL's base latency, α / α' the intra- / inter-node per-step
//               latency:
//                 all-reduce  ring a + (2(n−1) − 2(N−1))α + 2(N−1)α' + 2(n−1)/n·S/β
//                             tree a + 2((n/N − 1)α + ⌊log₂N⌋α') + 2S/β
//                 all-gather, reduce-scatter (S: the whole)
//                             a + ((n−1) − (N−1))α + (N−1)α' + (n−1)/n·S/β
//                 broadcast   a + (n−1)·(α' if N > 1 else α) + S/β
//                 barrier     an all-reduce of nothing
//                 send        the link's α + S/β (its receive is the same transfer: 0)
#include "comm/counting_communicator.h"
#include "backend/counting_backend.h"
#include "plan/cluster.h"

namespace bottle {

double gemm_seconds(const ClusterSpec& c, const GemmShape& g);
// `bf16`: the run's activations are bf16 (attention's rate).
double kernel_seconds(const ClusterSpec& c, const std::string& kernel, const KernelCount& k,
                      bool bf16);
// The step's tail kernels (is_tail_kernel) of `ops` when `tail`, else every GEMM and the other
// kernels.
double ops_seconds(const ClusterSpec& c, const OpCounts& ops, bool tail, bool bf16);
// Whether a kernel belongs to the step's tail, after the pipeline: AdamW, the gradient norm's
// sums of squares, DP's gradient scaling.
bool is_tail_kernel(const std::string& kernel);

// How many nodes the world ranks first + i·stride (i < ranks) span, nodes holding
// gpus_per_node consecutive ranks (world ranks are laid out TP fastest, process_groups.h).
int nodes_spanned(const ClusterSpec& c, int64_t first, int ranks, int64_t stride);
// One call of `kind` moving `bytes` among `ranks` ranks on `nodes` nodes.
double collective_seconds(const ClusterSpec& c, Collective kind, double bytes, int ranks,
                          int nodes);

}  // namespace bottle
