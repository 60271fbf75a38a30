#include "train/memory_plan.h"

#include <algorithm>
#include <vector>

namespace bottle {

MemoryBreakdown plan_rank_memory(const TrainConfig& config, const TensorParallel& tp,
                                 const PipelineStage& stage, int slots) {
  const TrainingConfig& tc = config.training;
  const int64_t dp = config.parallel.dp;
  const bool zero = config.parallel.zero && dp > 1;
  LlamaModel plan(config.model, tp, zero ? dp : 1, stage, /*reserve_only=*/true);
  plan.allocate_activations(tc.micro_batch_size, tc.seq_len, slots, tc.recompute);
  MemoryBreakdown m = plan.memory();
  // As AdamW, DataParallel and the trainer allocate them.
  const int64_t elements = plan.parameters().values().numel();
  const int64_t shard = zero ? elements / dp : elements;
  m[MemoryTag::optimizer] = 2 * aligned_size(size_t(shard) * sizeof(float));
  if (zero) m[MemoryTag::comm] += aligned_size(size_t(shard) * sizeof(float));
  m[MemoryTag::workspace] =
      2 * size_t(tc.grad_accum_steps) *
      aligned_size(size_t(tc.micro_batch_size * tc.seq_len) * sizeof(int32_t));
  return m;
}

std::string describe_memory(const MemoryBreakdown& m) {
  std::string out;
  for (size_t i = 0; i < m.bytes.size(); ++i)
    out += fmt::format("{}{} {}", i ? ", " : "", memory_tag_name(MemoryTag(i)),
                       format_bytes(m.bytes[i]));
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
    world.all_gather(Tensor{all.data(), {int64_t(all.size())}, DType::i32},
                     Tensor{mine.data(), {int64_t(mine.size())}, DType::i32}, "train.memory");
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
