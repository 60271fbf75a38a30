#pragma once
// A cluster as `bottle plan` prices work on it (docs/design.md §22): one GPU's peak rates,
// memory and bandwidth, the GPUs per node, the links inside and between nodes with NCCL's
// latencies, and two global efficiency constants. Read from a TOML cluster file, or one of
// the presets of clusters/ built into the binary.
#include <string>
#include <vector>

namespace bottle {

struct Link {
  double bandwidth_gbs = 0;  // per GPU and direction, GB/s (10^9 bytes)
  double latency_us = 0;     // per step of a ring (NCCL's hardware latency)
  // Per step for a message of at most ClusterSpec::small_message_bytes, which a transport
  // sends another way (NCCL's LL protocol; over MPI, eagerly, without the rendezvous a large
  // message waits for); negative: not given, latency_us.
  double small_latency_us = -1;
  double step_latency_us(bool small) const {
    return small && small_latency_us >= 0 ? small_latency_us : latency_us;
  }
};

struct ClusterSpec {
  std::string name, description, source;  // source: the file or "preset NAME"
  std::string gpu_name;
  double bf16_tflops = 0, fp32_tflops = 0;
  double memory_gib = 0, memory_bandwidth_gbs = 0;
  double kernel_overhead_us = 0;  // per kernel launch not hidden behind the kernel before
  // Causal attention's rate where it was measured (--calibrate); 0: gemm efficiency × peak.
  double attention_tflops = 0;
  // The rate GEMMs stream their operands at, where it was measured on thin products
  // (--calibrate); 0: the memory bandwidth × bandwidth efficiency, as for every other kernel.
  double gemm_bandwidth_gbs = 0;
  int gpus_per_node = 1;
  Link intra_node, inter_node;
  double nccl_base_latency_us = 0;  // per collective call
  // Messages of at most this many bytes pay the links' small_latency_us; 0: none do.
  double small_message_bytes = 0;
  double gemm_efficiency = 1, bandwidth_efficiency = 1;
  // How much longer a rank's kernels take while a collective of its own moves beside them
  // (0.25: a quarter longer); what overlap pays for what it hides. Measured by --calibrate,
  // where the transfers' packet work runs on the cores that compute; 0 in the GPU presets,
  // where NICs and NVLink move the bytes (the SMs NCCL's kernels take are not measured yet).
  double overlap_compute_slowdown = 0;
  // How much longer a started collective takes, run beside the kernels by the communication
  // thread, than the same call blocking (0.4: 40 % longer). Measured by --calibrate: over TCP
  // the thread polls with pauses (it may not spin beside the kernels), and each pause stalls
  // the transfer; 0 in the GPU presets (NCCL's stream runs a started call as a blocking one).
  double overlap_call_slowdown = 0;
};

// The preset names ("a100-perlmutter", "h100", "h200").
std::vector<std::string> cluster_presets();
// A preset by name, or else a cluster file at that path. Fails naming the preset list when
// it is neither, and the file and key for a missing, mistyped, out-of-range or unknown key.
ClusterSpec load_cluster(const std::string& preset_or_path);
ClusterSpec parse_cluster(const std::string& toml_text, const std::string& source);
// A cluster file `parse_cluster` reads back to the same spec, with `comment` (lines without
// '#') at its top.
std::string cluster_to_toml(const ClusterSpec& spec, const std::string& comment);

}  // namespace bottle
