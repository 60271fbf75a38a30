#include "train/memory_plan.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <sstream>
#include <vector>

#include "backend/counting_backend.h"
#include "train/train_step.h"

namespace bottle {
namespace {

// One rank's widest rows of each kind (KernelShapes) in a step of `config`, its block's widths
// `dims`.
KernelShapes kernel_shapes(const TrainConfig& config, const BlockDims& dims) {
  const ModelConfig& m = config.model;
  KernelShapes s;
  s.dtype = compute_dtype(config.training.precision);
  s.seq = config.training.seq_len;
  s.head_dim = dims.head_dim;
  s.rope_width = dims.heads * dims.head_dim;
  // A layout that shards the residual stream norms d/t of it: the whole width bounds it.
  s.hidden = m.hidden_size;
  s.logits = m.vocab_size / config.parallel.tp;  // vocab_parallel.h's share
  if (m.bottleneck != BottleneckKind::none) {
    auto rank = [&](ProjectionId p) { return m.rank_of(p); };
    using P = ProjectionId;
    // The projections that read one input lay their latents side by side (projection_group.h),
    // and online RMSNorm scales those rows whole.
    s.latent = std::max({rank(P::q) + rank(P::k) + rank(P::v), rank(P::gate) + rank(P::up),
                         rank(P::o), rank(P::down)});
    if (m.bottleneck == BottleneckKind::lax)
      for (int p = 0; p < kNumProjections; ++p)
        s.latent_norm = std::max(s.latent_norm, rank(ProjectionId(p)));
  }
  return s;
}

// The largest Backend::gemm_scratch_bytes of `be` over the GEMMs of one micro-batch of the
// step (every micro-batch runs the same products), run on the counting backend.
int64_t largest_gemm_scratch(const TrainConfig& config, int tp_rank, const PipelineStage& stage,
                             Backend& be) {
  TrainConfig one = bench_step_config(config);
  one.training.grad_accum_steps = 1;
  const ParallelConfig& p = config.parallel;
  CountingCommunicator tp("tp", int(p.tp), tp_rank), dp("dp", int(p.dp), 0),
      pipe("pp", stage.stages, stage.stage, tied_embedding_split(stage.stages));
  CountingBackend counting;
  counting.set_gemm_scratch_source(&be);
  // Arenas count the counting backend's address space as memory until the step is gone: the
  // process's peaks are put back as they were.
  const MemoryStats before = MemoryStats::global();
  {
    TrainStep step(one, counting, tensor_parallel_of(one, &tp), stage.stages > 1 ? &pipe : nullptr,
                   p.dp > 1 ? &dp : nullptr);
    step.allocate_activations();
    step.step(0);
  }
  MemoryStats::global() = before;
  return counting.largest_gemm_scratch();
}

}  // namespace

KernelScratch plan_kernel_scratch(const TrainConfig& config, int tp_rank,
                                  const PipelineStage& stage, Backend& be) {
  const TrainingConfig& tc = config.training;
  const BlockDims dims =
      config.parallel.tp_mode->block_dims(config.model.shape(), int(config.parallel.tp));
  const DType dtype = compute_dtype(tc.precision);
  KernelScratch s;
  s.attention = be.attention_workspace_bytes(tc.micro_batch_size, tc.seq_len, dims.heads,
                                             dims.kv_heads, dims.head_dim, dtype);
  s.other = be.kernel_scratch_bytes(kernel_shapes(config, dims));
  if (dtype != DType::f32) s.other += largest_gemm_scratch(config, tp_rank, stage, be);
  return s;
}

void check_batch_shape(const ModelConfig& m, int64_t batch, int64_t seq, const std::string& where,
                       const std::string& batch_name, const std::string& seq_name) {
  int64_t tokens = 0;
  BOTTLE_CHECK(!__builtin_mul_overflow(batch, seq, &tokens),
               "{} {} ({}) x {} ({}) tokens overflow 64 bits; lower {}", where, batch_name, batch,
               seq_name, seq, batch_name);
  // The widest row of an activation; 8 bytes an element leaves room for byte counts and sums.
  const auto [width, width_name] =
      std::max<std::pair<int64_t, const char*>>({{m.vocab_size, "the vocabulary"},
                                                 {m.hidden_size, "the hidden size"},
                                                 {m.intermediate_size, "the MLP width"}});
  int64_t bytes = 0;
  BOTTLE_CHECK(!__builtin_mul_overflow(tokens, width, &bytes) &&
                   !__builtin_mul_overflow(bytes, int64_t(8), &bytes),
               "{} {} ({}) x {} ({}) x {} ({}) activation elements overflow 64-bit byte counts; "
               "lower {}",
               where, batch_name, batch, seq_name, seq, width_name, width, batch_name);
}

namespace {

// The first number of the line of /proc/meminfo that starts with `key`, in bytes.
std::optional<size_t> meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind(key + ":", 0) == 0) {
      std::istringstream fields(line.substr(key.size() + 1));
      size_t kib = 0;
      if (fields >> kib) return kib * 1024;
    }
  return std::nullopt;
}

// A cgroup file's number; nullopt for "max", a missing file or v1's "unlimited" 2^63-ish.
std::optional<size_t> cgroup_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text == "max") return std::nullopt;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (*end != '\0' || v >= (1ull << 62)) return std::nullopt;
  return size_t(v);
}

uint64_t host_hash() {
  char name[256] = {};
  ::gethostname(name, sizeof name - 1);
  return std::hash<std::string>{}(name);
}

// The ranks on one host (the same host name) share its memory: their plans add up.
void refuse_beyond_available(const MemoryBreakdown& plan, Communicator& world,
                             const std::string& what, const std::string& advice,
                             const char* planned) {
  const size_t available = available_memory_bytes();
  constexpr size_t kTags = size_t(MemoryTag::count);
  // Every rank learns every rank's plan and host, so that all of them decide alike.
  std::array<size_t, kTags + 2> mine{};
  std::copy(plan.bytes.begin(), plan.bytes.end(), mine.begin());
  mine[kTags] = size_t(host_hash());
  mine[kTags + 1] = available;
  const auto all = gather_sizes(world, mine);
  const size_t my_host = all[size_t(world.rank())][kTags];
  size_t host_bytes = 0, host_available = 0;
  int host_ranks = 0, worst_rank = 0;
  MemoryBreakdown worst;
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r][kTags] != my_host) continue;
    MemoryBreakdown p;
    std::copy(all[r].begin(), all[r].begin() + kTags, p.bytes.begin());
    const size_t total = p.total();
    // Saturating: a plan past 2^64 bytes is refused all the same.
    host_bytes = host_bytes > SIZE_MAX - total ? SIZE_MAX : host_bytes + total;
    if (host_ranks++ == 0 || total > worst.total()) worst_rank = int(r), worst = p;
    const size_t seen = all[r][kTags + 1];
    if (seen) host_available = host_available ? std::min(host_available, seen) : seen;
  }
  // Unknown available memory (no /proc): nothing to compare with.
  if (host_available == 0 || host_bytes <= host_available) return;
  fail(
      "{}: {} {} ({} bytes) on {} rank(s) of this machine, but it has only {} available "
      "(MemAvailable of /proc/meminfo, within the cgroup's memory limit); largest: rank {} ({}); "
      "{}",
      what, planned, format_bytes(host_bytes), host_bytes, host_ranks, format_bytes(host_available),
      worst_rank, describe_memory(worst), advice);
}

}  // namespace

size_t available_memory_bytes() {
  size_t available = meminfo_bytes("MemAvailable").value_or(0);
  auto lower = [&](std::optional<size_t> limit, std::optional<size_t> used) {
    if (!limit) return;
    const size_t left = *limit > used.value_or(0) ? *limit - used.value_or(0) : 0;
    available = available ? std::min(available, left) : left;
  };
  lower(cgroup_number("/sys/fs/cgroup/memory.max"), cgroup_number("/sys/fs/cgroup/memory.current"));
  lower(cgroup_number("/sys/fs/cgroup/memory/memory.limit_in_bytes"),
        cgroup_number("/sys/fs/cgroup/memory/memory.usage_in_bytes"));
  return available;
}

void check_available_memory(const MemoryBreakdown& plan, Communicator& world,
                            const std::string& what, const std::string& advice) {
  refuse_beyond_available(plan, world, what, advice, "the planned memory is");
}

void check_parameter_memory(const ModelConfig& m, bool training, int64_t model_shards,
                            int64_t optimizer_shards, int64_t gradient_shards, Communicator& world,
                            const std::string& what, const std::string& advice) {
  // In doubles: a model this check exists for may count more than 2^63 parameters.
  double per_block = 2.0 * double(m.hidden_size);
  for (int i = 0; i < kNumProjections; ++i) {
    const auto p = ProjectionId(i);
    per_block += m.bottleneck == BottleneckKind::none
                     ? double(m.d_in(p)) * double(m.d_out(p))
                     : double(m.rank_of(p)) * double(m.d_in(p) + m.d_out(p));
  }
  const double params = per_block * double(m.num_layers) +
                        double(m.vocab_size) * double(m.hidden_size) * (m.tie_embeddings ? 1 : 2);
  // fp32 weights; training adds gradients and two AdamW moments.
  const double bytes = params * 4.0 / double(std::max<int64_t>(1, model_shards));
  const size_t per_copy = bytes >= 1e18 ? size_t(1e18) : size_t(bytes);
  MemoryBreakdown lower_bound;
  lower_bound[MemoryTag::weights] = per_copy;
  if (training) {
    lower_bound[MemoryTag::gradients] = per_copy / size_t(std::max<int64_t>(1, gradient_shards));
    lower_bound[MemoryTag::optimizer] =
        2 * per_copy / size_t(std::max<int64_t>(1, optimizer_shards));
  }
  refuse_beyond_available(lower_bound, world, what, advice,
                          training ? "the parameters, gradients and optimizer state alone need"
                                   : "the parameters alone need");
}

void check_layers_memory(const ModelConfig& model, const TensorParallel& tp, int64_t batch,
                         int64_t seq, Communicator& world, const std::string& what,
                         const std::string& advice) {
  // Below this many layers the whole plan is quick.
  constexpr int64_t kFewLayers = 64;
  if (model.num_layers <= kFewLayers) return;
  ModelConfig two = model, three = model;
  two.num_layers = 2;
  three.num_layers = 3;
  const MemoryBreakdown a = plan_model_memory(two, tp, batch, seq, false),
                        b = plan_model_memory(three, tp, batch, seq, false);
  MemoryBreakdown estimate;
  const double more_layers = double(model.num_layers - 3);
  for (size_t i = 0; i < estimate.bytes.size(); ++i) {
    const double per_layer = b.bytes[i] > a.bytes[i] ? double(b.bytes[i] - a.bytes[i]) : 0.0;
    const double total = double(b.bytes[i]) + per_layer * more_layers;
    // Saturating, as check_parameter_memory's: refused all the same.
    estimate.bytes[i] = total >= 1e18 ? size_t(1e18) : size_t(total);
  }
  refuse_beyond_available(estimate, world, what, advice, "the planned memory is");
}

MemoryBreakdown plan_rank_memory(const TrainConfig& config, const TensorParallel& tp,
                                 const PipelineStage& stage, int slots, int64_t attention_workspace,
                                 int64_t kernel_scratch) {
  const TrainingConfig& tc = config.training;
  const int64_t dp = config.parallel.dp;
  const bool zero = config.parallel.zero && dp > 1;
  LlamaModel plan(config.model, tp, parameter_sharding(config), stage, /*reserve_only=*/true,
                  host_backend(), compute_dtype(tc.precision));
  plan.allocate_activations(tc.micro_batch_size, tc.seq_len, slots, tc.recompute,
                            schedule_info(config.parallel.schedule).splits_weight_pass);
  MemoryBreakdown m = plan.memory();
  // As AdamW, DataParallel and the trainer allocate them.
  const int64_t elements = plan.parameters().padded();
  const int64_t shard = zero ? elements / dp : elements;
  // Muon: the matrices' momentum and AdamW's moments for the rest, and its iteration's scratch.
  const MuonMemory muon =
      config.optimizer.name == OptimizerKind::muon
          ? muon_memory(plan.parameters(), tp.size(),
                        zero ? DataParallel::layout(plan.parameters(), int(config.parallel.zero),
                                                    int(dp), 0, dp_bucket_bytes(config))
                             : ShardLayout{})
          : MuonMemory{};
  m[MemoryTag::optimizer] = config.optimizer.name == OptimizerKind::muon
                                ? muon.state
                                : 2 * aligned_size(size_t(shard) * sizeof(float));
  if (zero) m[MemoryTag::comm] += aligned_size(size_t(shard) * sizeof(float));
  // ZeRO-2 and 3: the reduced gradients' shard beside the store's unit slots.
  if (zero && config.parallel.zero >= 2)
    m[MemoryTag::gradients] += aligned_size(size_t(shard) * sizeof(float));
  // ZeRO-1 and 2 gather bf16 compute copies from a shard of their own (ZeRO-3 gathers the
  // masters straight into the store's slots).
  if (zero && config.parallel.zero < 3 && plan.parameters().mixed_precision())
    m[MemoryTag::comm] += aligned_size(size_t(shard) * dtype_size(DType::bf16));
  // checkpoint.async on a host backend: the copy of what the rank holds (its masters and both
  // moments, its shard of them under ZeRO) lives in the host's memory while it is written
  // (CheckpointStore::save_async). A GPU's copy is in host memory, not the device's.
  if (config.checkpoint.async && config.training.backend != BackendKind::cuda)
    m[MemoryTag::comm] += 3 * aligned_size(size_t(shard) * sizeof(float));
  m[MemoryTag::workspace] =
      2 * size_t(tc.grad_accum_steps) *
          aligned_size(size_t(tc.micro_batch_size * tc.seq_len) * sizeof(int32_t)) +
      TrainStep::scalar_bytes();
  m[MemoryTag::workspace] += aligned_size(size_t(kernel_scratch)) + muon.scratch;
  // One attention call runs at a time, so its workspace is held once, however many blocks.
  if (attention_workspace > 0) {
    m.attention = aligned_size(size_t(attention_workspace));
    m[MemoryTag::workspace] += m.attention;
  }
  return m;
}

MemoryBreakdown plan_model_memory(const ModelConfig& config, const TensorParallel& tp,
                                  int64_t batch, int64_t seq, bool training, PipelineStage stage) {
  LlamaModel plan(config, tp, 1, stage, /*reserve_only=*/true);
  plan.allocate_activations(batch, seq);
  MemoryBreakdown m = plan.memory();
  if (training)
    m[MemoryTag::optimizer] = 2 * aligned_size(size_t(plan.parameters().padded()) * sizeof(float));
  m[MemoryTag::workspace] += 2 * aligned_size(size_t(batch * seq) * sizeof(int32_t));
  return m;
}

std::string describe_memory(const MemoryBreakdown& m) {
  std::string out;
  for (size_t i = 0; i < m.bytes.size(); ++i) {
    out += fmt::format("{}{} {}", i ? ", " : "", memory_tag_name(MemoryTag(i)),
                       format_bytes(m.bytes[i]));
    if (MemoryTag(i) == MemoryTag::workspace && m.attention)
      out += fmt::format(" (attention {})", format_bytes(m.attention));
  }
  return out;
}

std::vector<std::vector<size_t>> gather_sizes(Communicator& world, std::span<const size_t> sizes) {
  // Each size as two 32-bit halves: collectives carry f32 or i32, and f32 would round.
  const size_t count = sizes.size();
  std::vector<int32_t> mine(2 * count), all(2 * count * size_t(world.size()));
  for (size_t i = 0; i < count; ++i) {
    mine[2 * i] = int32_t(uint32_t(sizes[i]));
    mine[2 * i + 1] = int32_t(uint32_t(uint64_t(sizes[i]) >> 32));
  }
  if (world.size() > 1)
    world.all_gather(host_tensor(std::span(all)), host_tensor(std::span(mine)), "train.memory");
  else
    all = mine;
  std::vector<std::vector<size_t>> out(size_t(world.size()), std::vector<size_t>(count));
  for (size_t r = 0; r < out.size(); ++r)
    for (size_t i = 0; i < count; ++i) {
      const size_t at = 2 * (r * count + i);
      out[r][i] = size_t(uint32_t(all[at])) | size_t(uint32_t(all[at + 1])) << 32;
    }
  return out;
}

void check_memory_limit(const TrainConfig& config, const MemoryBreakdown& plan, Communicator& world,
                        const std::string& config_path) {
  const int64_t limit = config.training.memory_limit;
  if (limit <= 0) return;
  // Every rank learns every rank's plan, so that all of them fail with the same message.
  int worst = 0;
  MemoryBreakdown worst_plan;
  const auto plans = gather_sizes(world, plan.bytes);
  for (size_t r = 0; r < plans.size(); ++r) {
    MemoryBreakdown p;
    std::copy(plans[r].begin(), plans[r].end(), p.bytes.begin());
    if (r == 0 || p.total() > worst_plan.total()) worst = int(r), worst_plan = p;
  }
  BOTTLE_CHECK(worst_plan.total() <= size_t(limit),
               "{}: training.memory_limit is {} ({} bytes), but this layout needs an estimated {} "
               "on rank {} ({}); lower training.micro_batch_size, set training.recompute, or "
               "spread the model over more ranks",
               config_path, format_bytes(size_t(limit)), limit, format_bytes(worst_plan.total()),
               worst, describe_memory(worst_plan));
}

}  // namespace bottle
