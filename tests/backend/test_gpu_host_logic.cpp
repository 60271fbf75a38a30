// The GPU path's host-side rules that need no GPU to check: the growing device buffers'
// state after a failed allocation (backend/cuda/growing_buffer.h), cuDNN's attention backward
// choice and its planned workspace (backend/attention_workspace.h), and a batched GEMM run as its
// single items (GemmArgs::item, what the cuda backend does where cuBLASLt has no batched
// algorithm), item by item against the reference backend's batched GEMM.
#include <gtest/gtest.h>

#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/attention_workspace.h"
#include "backend/backend.h"
#include "backend/cuda/growing_buffer.h"
#include "core/error.h"
#include "train/memory_plan.h"
#include "train/train_config.h"
#include "train/train_step.h"

namespace bottle {
namespace {

// Host memory standing in for cudaMalloc, failing the requests it is told to fail; it counts
// what is live, so that a leak or a double free shows.
struct FailingMemory {
  int fail_next = 0;  // how many of the next requests fail
  std::map<void*, std::unique_ptr<char[]>> live;
  void* try_allocate(size_t bytes) {
    if (fail_next > 0) {
      --fail_next;
      return nullptr;
    }
    auto block = std::make_unique<char[]>(bytes);
    void* p = block.get();
    live.emplace(p, std::move(block));
    return p;
  }
  void release(void* block) {
    ASSERT_EQ(live.erase(block), 1u) << "released a block that is not live";
  }
  [[noreturn]] void fail(size_t bytes, const char* what) {
    throw std::runtime_error("cannot allocate " + std::to_string(bytes) + " for " + what);
  }
};

using Buffer = cuda::GrowingBuffer<FailingMemory>;

TEST(GrowingBuffer, GrowsToTheLargestRequestAndReusesIt) {
  FailingMemory memory;
  Buffer buffer;
  void* a = buffer.reserve(memory, 100, 256, "scratch");
  EXPECT_EQ(buffer.capacity(), 256u);
  EXPECT_EQ(buffer.reserve(memory, 200, 256, "scratch"), a);  // fits: the same block
  void* b = buffer.reserve(memory, 1000, 256, "scratch");
  EXPECT_EQ(buffer.capacity(), 1024u);
  EXPECT_EQ(memory.live.size(), 1u);  // the old block was freed
  EXPECT_EQ(buffer.data(), b);
  buffer.clear(memory);
  EXPECT_TRUE(memory.live.empty());
}

// The defect this class fixes: the size was recorded before cudaMalloc ran, so after a
// caught failure a smaller request was handed a null pointer.
TEST(GrowingBuffer, AFailedFirstAllocationLeavesItEmptyAndASmallerRequestStillGetsMemory) {
  FailingMemory memory;
  Buffer buffer;
  memory.fail_next = 1;
  EXPECT_THROW(buffer.reserve(memory, 4096, 256, "attention workspace"), std::runtime_error);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(buffer.capacity(), 0u);
  void* p = buffer.reserve(memory, 512, 256, "norm partials");
  ASSERT_NE(p, nullptr);
  EXPECT_GE(buffer.capacity(), 512u);
  buffer.clear(memory);
}

TEST(GrowingBuffer, AFailedGrowthKeepsTheOldBlockWhenOnlyTheNewOneCannotBeHad) {
  FailingMemory memory;
  Buffer buffer;
  void* old = buffer.reserve(memory, 1000, 256, "scratch");
  // The first try (both blocks at once) fails, the old one is released, the retry succeeds.
  memory.fail_next = 1;
  void* fresh = buffer.reserve(memory, 5000, 256, "scratch");
  ASSERT_NE(fresh, nullptr);
  EXPECT_NE(fresh, old);
  EXPECT_EQ(buffer.capacity(), 5120u);
  EXPECT_EQ(memory.live.size(), 1u);
  // Both tries fail: no block, capacity 0 (never a capacity without a block), and a smaller
  // request allocates again.
  memory.fail_next = 2;
  EXPECT_THROW(buffer.reserve(memory, 9000, 256, "scratch"), std::runtime_error);
  EXPECT_EQ(buffer.data(), nullptr);
  EXPECT_EQ(buffer.capacity(), 0u);
  EXPECT_TRUE(memory.live.empty());
  EXPECT_NE(buffer.reserve(memory, 100, 256, "scratch"), nullptr);
  buffer.clear(memory);
  EXPECT_TRUE(memory.live.empty());
}

TEST(GrowingBuffer, ARequestThatFitsAllocatesNothing) {
  FailingMemory memory;
  Buffer buffer;
  void* old = buffer.reserve(memory, 1000, 256, "scratch");
  memory.fail_next = 1;  // an allocation now would fail
  EXPECT_EQ(buffer.reserve(memory, 800, 256, "scratch"), old);
  EXPECT_EQ(memory.fail_next, 1);  // none was asked for
  EXPECT_EQ(buffer.capacity(), 1024u);
  buffer.clear(memory);
}


// --- cuDNN's deterministic attention backward: which engine, what workspace.

constexpr int64_t kMiB = int64_t(1) << 20, kGiB = int64_t(1) << 30;

TEST(SdpaBackward, TheDpWorkspaceIsTheFrontendsFormula) {
  // The three shapes: B·H·S²·2 bytes (S a multiple of 128 pads nothing).
  EXPECT_EQ(sdpa_dp_workspace_bytes(4, 16, 2048), 512 * kMiB);
  EXPECT_EQ(sdpa_dp_workspace_bytes(4, 32, 4096), 4 * kGiB);
  EXPECT_EQ(sdpa_dp_workspace_bytes(4, 16, 8192), 8 * kGiB);
  // Queries padded to 64, keys to 128: S = 100 counts as 128 × 128, S = 130 as 192 × 256.
  EXPECT_EQ(sdpa_dp_workspace_bytes(1, 1, 100), 128 * 128 * 2);
  EXPECT_EQ(sdpa_dp_workspace_bytes(1, 1, 130), 192 * 256 * 2);
}

TEST(SdpaBackward, BelowTheBoundTheDpWorkspaceRunsAndIsPlanned) {
  const SdpaBackwardPlan p = plan_sdpa_backward(4, 2048, 16, 128, 9, 92500, kSdpaDpWorkspaceBound);
  EXPECT_FALSE(p.ordered_dq);
  EXPECT_EQ(p.dp_bytes, 512 * kMiB);
  // dP plus the linear part: fp32 dQ sums and row sums, B·H·S·(hd + 1)·4 bytes (64.5 MiB).
  EXPECT_EQ(p.workspace_bytes, p.dp_bytes + int64_t(4) * 16 * 2048 * 129 * 4);
  EXPECT_NE(p.reason.find("dP workspace of 512.0 MiB"), std::string::npos) << p.reason;
}

TEST(SdpaBackward, AboveTheBoundHopperWithCudnn925TakesTheLinearEngine) {
  const SdpaBackwardPlan p = plan_sdpa_backward(4, 4096, 32, 128, 9, 92500, kSdpaDpWorkspaceBound);
  EXPECT_TRUE(p.ordered_dq);
  EXPECT_EQ(p.dp_bytes, 4 * kGiB);
  // fp32 dQ sums and row sums: B·H·S·(hd + 1)·4 = 4·32·4096·129·4 bytes, about 258 MiB.
  EXPECT_EQ(p.workspace_bytes, int64_t(4) * 32 * 4096 * 129 * 4);
  EXPECT_NE(p.reason.find("ordered dQ"), std::string::npos) << p.reason;
  EXPECT_NE(p.reason.find("4.00 GiB"), std::string::npos) << p.reason;
  // Linear in S: twice the sequence, twice the workspace.
  const SdpaBackwardPlan twice =
      plan_sdpa_backward(4, 8192, 32, 128, 9, 92500, kSdpaDpWorkspaceBound);
  EXPECT_EQ(twice.workspace_bytes, 2 * p.workspace_bytes);
}

TEST(SdpaBackward, WithoutTheLinearEngineTheDpWorkspaceIsPlannedAndTheReasonSaysWhy) {
  // cuDNN 9.19 on Hopper, and any cuDNN on Ampere: the dP workspace is the only deterministic
  // backward, so the plan counts all of it.
  const SdpaBackwardPlan old = plan_sdpa_backward(4, 4096, 32, 128, 9, 91900, kSdpaDpWorkspaceBound);
  EXPECT_FALSE(old.ordered_dq);
  EXPECT_GE(old.workspace_bytes, 4 * kGiB);
  EXPECT_NE(old.reason.find("cuDNN 9.19 has no linear-workspace"), std::string::npos) << old.reason;
  const SdpaBackwardPlan ampere =
      plan_sdpa_backward(4, 4096, 32, 128, 8, 92500, kSdpaDpWorkspaceBound);
  EXPECT_FALSE(ampere.ordered_dq);
  EXPECT_NE(ampere.reason.find("sm_8x"), std::string::npos) << ampere.reason;
}

TEST(SdpaBackward, TheUsersBoundDecides) {
  // -1: never bounded (the dP workspace whatever its size); 0: the linear engine always.
  EXPECT_FALSE(plan_sdpa_backward(4, 4096, 32, 128, 9, 92500, -1).ordered_dq);
  EXPECT_TRUE(plan_sdpa_backward(1, 128, 1, 64, 9, 92500, 0).ordered_dq);
  ASSERT_EQ(setenv(kCudnnDpWorkspaceLimitVariable, "1048576", 1), 0);
  EXPECT_EQ(sdpa_dp_workspace_limit(), 1048576);
  ASSERT_EQ(setenv(kCudnnDpWorkspaceLimitVariable, "lots", 1), 0);
  EXPECT_EQ(sdpa_dp_workspace_limit(), kSdpaDpWorkspaceBound);
  ASSERT_EQ(unsetenv(kCudnnDpWorkspaceLimitVariable), 0);
  EXPECT_EQ(sdpa_dp_workspace_limit(), kSdpaDpWorkspaceBound);
}

// The memory plan holds the attention's workspace once, inside the workspace tag, and names
// it in the run's memory line.
TEST(SdpaBackward, TheMemoryPlanCountsAndNamesIt) {
  const TrainConfig config = parse_train_config_string(
      "[model]\nvocab_size = 256\nhidden_size = 64\nintermediate_size = 128\nnum_layers = 2\n"
      "num_heads = 4\n[training]\nmicro_batch_size = 2\nseq_len = 32\n",
      "test.toml");
  const TensorParallel tp = tensor_parallel_of(config, nullptr);
  const MemoryBreakdown without = plan_rank_memory(config, tp, {}, 1);
  const MemoryBreakdown with = plan_rank_memory(config, tp, {}, 1, 512 * kMiB);
  EXPECT_EQ(without.attention, 0u);
  EXPECT_EQ(with.attention, size_t(512 * kMiB));
  EXPECT_EQ(with.total() - without.total(), size_t(512 * kMiB));
  EXPECT_EQ(with[MemoryTag::workspace] - without[MemoryTag::workspace], size_t(512 * kMiB));
  EXPECT_EQ(describe_memory(without).find("attention"), std::string::npos);
  EXPECT_NE(describe_memory(with).find("(attention 512.0 MiB)"), std::string::npos)
      << describe_memory(with);
}

// --- A batched GEMM run as its items (GemmArgs::item): the cuda backend's way out where
// cuBLASLt's heuristic has no batched algorithm. Item by item on the reference backend, the
// results must be the batched GEMM's bit for bit, and nothing outside C written.

struct BatchedCase {
  const char* name;
  bool ta, tb;
  int64_t m, n, k, batch;
  bool broadcast_a, broadcast_b, column_blocks, separate_c;
  DType a_dtype, c_dtype;
  float beta;
};

std::vector<uint16_t> random_bf16(size_t n, uint32_t seed) {
  std::vector<uint16_t> v(n);
  for (size_t i = 0; i < n; ++i) {
    seed = seed * 1664525u + 1013904223u;
    const float x = float(int32_t(seed >> 9) % 2001 - 1000) / 997.0f;
    uint32_t bits = 0;
    std::memcpy(&bits, &x, 4);
    v[i] = uint16_t(bits >> 16);
  }
  return v;
}

// A buffer of n elements of `dtype`, filled from `seed` (bf16 values, exact in f32 too).
std::vector<char> filled(size_t n, DType dtype, uint32_t seed) {
  const std::vector<uint16_t> h = random_bf16(n, seed);
  std::vector<char> out(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) {
    if (dtype == DType::bf16) {
      std::memcpy(out.data() + 2 * i, &h[i], 2);
    } else {
      const uint32_t bits = uint32_t(h[i]) << 16;
      std::memcpy(out.data() + 4 * i, &bits, 4);
    }
  }
  return out;
}

TEST(GemmItems, ItemByItemIsTheBatchedGemm) {
  const std::vector<BatchedCase> cases = {
      {"x broadcast (stride 0), the shared-input forward", false, true, 6, 5, 7, 3, true, false,
       false, false, DType::f32, DType::f32, 0.0f},
      {"B broadcast", false, false, 4, 6, 5, 3, false, true, false, false, DType::f32, DType::f32,
       0.0f},
      {"interleaved column blocks of one output", false, false, 6, 3, 5, 4, false, false, true,
       false, DType::f32, DType::f32, 1.0f},
      {"bf16 operands, C from c_in", true, false, 5, 4, 6, 2, false, false, false, true,
       DType::bf16, DType::bf16, 1.0f},
  };
  std::unique_ptr<Backend> be = make_backend("reference");
  for (const BatchedCase& t : cases) {
    SCOPED_TRACE(t.name);
    const int64_t a_rows = t.ta ? t.k : t.m, a_cols = t.ta ? t.m : t.k;
    const int64_t b_rows = t.tb ? t.n : t.k, b_cols = t.tb ? t.k : t.n;
    GemmArgs g;
    g.trans_a = t.ta, g.trans_b = t.tb, g.m = t.m, g.n = t.n, g.k = t.k, g.batch = t.batch;
    g.beta = t.beta;
    g.lda = a_cols, g.stride_a = t.broadcast_a ? 0 : a_rows * a_cols;
    g.ldb = b_cols, g.stride_b = t.broadcast_b ? 0 : b_rows * b_cols;
    // Column blocks: item i writes columns [i n, (i + 1) n) of one [m, batch·n] matrix.
    g.ldc = t.column_blocks ? t.batch * t.n : t.n;
    g.stride_c = t.column_blocks ? t.n : t.m * t.n;
    g.a_dtype = t.a_dtype, g.b_dtype = t.a_dtype, g.c_dtype = t.c_dtype;
    const size_t na = size_t(t.broadcast_a ? a_rows * a_cols : t.batch * a_rows * a_cols);
    const size_t nb = size_t(t.broadcast_b ? b_rows * b_cols : t.batch * b_rows * b_cols);
    const size_t nc = size_t(t.batch * t.m * t.n) + 7;  // and a tail nobody may write
    const std::vector<char> a = filled(na, t.a_dtype, 1), b = filled(nb, t.a_dtype, 2);
    const std::vector<char> c0 = filled(nc, t.c_dtype, 3), c_in = filled(nc, t.c_dtype, 4);
    std::vector<char> batched = c0, items = c0;
    g.a = a.data(), g.b = b.data();
    if (t.separate_c) g.c_in = c_in.data();
    g.c = batched.data();
    be->gemm(g);
    GemmArgs per_item = g;
    per_item.c = items.data();
    for (int64_t i = 0; i < g.batch; ++i) {
      const GemmArgs one = per_item.item(i);
      EXPECT_EQ(one.batch, 1);
      be->gemm(one);
    }
    EXPECT_EQ(batched, items);
    EXPECT_NE(batched, c0);  // the GEMM wrote something
    const size_t tail = 7 * dtype_size(t.c_dtype);
    EXPECT_TRUE(std::equal(batched.end() - long(tail), batched.end(), c0.end() - long(tail)));
  }
}

}  // namespace
}  // namespace bottle
