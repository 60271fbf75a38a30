// Linear layer grouping (parallel/projection_group.h) on one group of three CoLA or SVD
// projections with uneven ranks (q 5, k and v 3: GQA's shapes), run through the group's
// forward and backward in three layouts on the same values:
//   stacked                 each member's latents [N, r_p] one after another (LaX, grouping off)
//   interleaved             one [N, Σr] buffer, the A's one [Σr, d_in] matrix in memory
//   interleaved, A's apart  one [N, Σr] buffer, the A's in separate allocations
// Every output and gradient agrees with the stacked run (fp32, up to the rounding of one GEMM
// with k = Σr against three adding into dx), and the interleaved run with the A's together
// issues one GEMM for each of x Aᵀ, dZ A and dZᵀ x where the stacked run issues 2, 3 and 2
// (the B's and dy's lie one after another here, so k's and v's batch in every layout).
// Full-rank q/k/v (linear_forward_shared_input and its backward) give the bits of one GEMM
// per projection, with k's and v's forward and weight gradient as one batched GEMM each.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/arena.h"
#include "backend/backend.h"
#include "backend/profiling_backend.h"
#include "nn/linear.h"
#include "nn/projection.h"
#include "parallel/projection_group.h"

namespace bottle {
namespace {

constexpr int64_t kRows = 6, kDin = 16, kDout = 8;
constexpr std::array<int64_t, 3> kRanks = {5, 3, 3};

enum class Layout { stacked, interleaved, interleaved_apart };

struct Outputs {
  std::map<std::string, std::vector<float>> tensors;  // by name
  std::map<std::string, int64_t> gemms;               // calls per GEMM shape
};

std::vector<float> host_copy(Tensor t) { return {t.f32(), t.f32() + t.numel()}; }

void fill(Tensor t, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = dist(rng);
}

Outputs run(BottleneckKind kind, Layout layout) {
  auto profiled = std::make_unique<ProfilingBackend>(make_backend("cpu"));
  ProfilingBackend& be = *profiled;
  Arena weights(MemoryTag::weights), act(MemoryTag::activations);
  int64_t width = 0;
  for (int64_t r : kRanks) width += r;
  // The A's of the group: one [Σr, d_in] allocation, or one each.
  const Tensor a_values = weights.alloc({width, kDin}), a_grads = weights.alloc({width, kDin});
  fill(a_values, 1, 0.3f);
  // The B's, one after another in one allocation each for values and gradients, so that k's
  // and v's are equally spaced whatever the arena does (ColumnBlocksOfOneBufferBatch).
  const Tensor b_values = weights.alloc({kDout * width}), b_grads = weights.alloc({kDout * width});
  fill(b_values, 10, 0.4f);

  std::array<Projection, 3> members;
  std::array<Projection*, 3> group{};
  int64_t row = 0;
  for (size_t i = 0; i < members.size(); ++i) {
    Projection& p = members[i];
    p.kind = kind;
    p.d_in = kDin;
    p.d_out = kDout;
    p.rank = kRanks[i];
    const Tensor value = a_values.view(row * kDin, {p.rank, kDin});
    if (layout == Layout::interleaved_apart) {
      p.A = Param(weights.alloc({p.rank, kDin}), weights.alloc({p.rank, kDin}));
      be.copy(p.A.value, value);
    } else {
      p.A = Param(value, a_grads.view(row * kDin, {p.rank, kDin}));
    }
    p.B = Param(b_values.view(row * kDout, {kDout, p.rank}),
                b_grads.view(row * kDout, {kDout, p.rank}));
    row += p.rank;
    group[i] = &p;
  }
  const ProjectionAllocators from{act, act, act, act, act};
  allocate_grouped_activations(
      from, kRows, group,
      layout == Layout::stacked ? LatentLayout::stacked : LatentLayout::interleaved);
  EXPECT_EQ(members[1].interleaved(), layout != Layout::stacked);

  const Tensor x = act.alloc({kRows, kDin}), dx = act.alloc({kRows, kDin});
  fill(x, 2, 1.0f);
  fill(dx, 3, 1.0f);  // garbage the backward overwrites
  // [member][N][d_out] each: equally spaced, as above.
  const Tensor y_all = act.alloc({3, kRows, kDout}), dy_all = act.alloc({3, kRows, kDout});
  fill(dy_all, 20, 1.0f);
  std::array<Tensor, 3> ys{}, dys{};
  for (size_t i = 0; i < ys.size(); ++i) {
    ys[i] = y_all.view(int64_t(i) * kRows * kDout, {kRows, kDout});
    dys[i] = dy_all.view(int64_t(i) * kRows * kDout, {kRows, kDout});
  }
  const std::array<Tensor, 3> none{};
  be.reset();
  group_down_forward(be, group, x, true);
  group_latent_forward(be, group, none);
  group_up_forward(be, group, ys, true);
  group_up_backward(be, group, dys, {}, false, true);
  group_latent_backward(be, group, none, none);
  group_down_backward(be, group, dx, x, false, true);

  Outputs out;
  for (const auto& [name, time] : be.times())
    if (name.starts_with("gemm")) out.gemms[name] = time.calls;
  out.tensors["dx"] = host_copy(dx);
  for (size_t i = 0; i < members.size(); ++i) {
    const Projection& p = members[i];
    const std::string id = std::to_string(i);
    out.tensors["y" + id] = host_copy(ys[i]);
    out.tensors["dA" + id] = host_copy(p.A.grad);
    out.tensors["dB" + id] = host_copy(p.B.grad);
    // The latents, gathered row by row whatever their row stride.
    for (const auto& [field, name] : {std::pair{&Projection::z, "z"},
                                      {&Projection::u, "u"},
                                      {&Projection::du, "du"},
                                      {&Projection::dz, "dz"}}) {
      const Tensor t = p.*field;
      std::vector<float> rows;
      for (int64_t r = 0; r < kRows; ++r)
        for (int64_t c = 0; c < p.rank; ++c) rows.push_back(t.f32()[r * p.latent_stride() + c]);
      out.tensors[name + id] = rows;
    }
  }
  return out;
}

int64_t calls_with_k(const Outputs& o, const std::string& suffix) {
  int64_t calls = 0;
  for (const auto& [name, count] : o.gemms)
    if (name.find(suffix) != std::string::npos) calls += count;
  return calls;
}

class ProjectionGroup : public ::testing::TestWithParam<BottleneckKind> {};

TEST_P(ProjectionGroup, InterleavedLatentsMatchStackedOnes) {
  const Outputs stacked = run(GetParam(), Layout::stacked);
  for (Layout layout : {Layout::interleaved, Layout::interleaved_apart}) {
    const Outputs other = run(GetParam(), layout);
    for (const auto& [name, want] : stacked.tensors) {
      const std::vector<float>& got = other.tensors.at(name);
      ASSERT_EQ(got.size(), want.size()) << name;
      for (size_t i = 0; i < want.size(); ++i)
        ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::abs(want[i])))
            << name << "[" << i << "], layout " << int(layout);
    }
  }
}

// x's gradient: 16 columns from k = Σr = 11 once, or k = 5 and k = 3 (twice) adding up.
TEST_P(ProjectionGroup, StackedAsGiveOneGemmEachWay) {
  const Outputs stacked = run(GetParam(), Layout::stacked);
  const Outputs together = run(GetParam(), Layout::interleaved);
  EXPECT_EQ(calls_with_k(stacked, "6x16x5 NN") + calls_with_k(stacked, "6x16x3 NN"), 3);
  EXPECT_EQ(calls_with_k(together, "6x16x11 NN"), 1);
  EXPECT_EQ(calls_with_k(together, "6x16x5 NN") + calls_with_k(together, "6x16x3 NN"), 0);
  EXPECT_EQ(calls_with_k(together, "6x11x16 NT"), 1);  // Z = x [A_p]ᵀ
  EXPECT_EQ(calls_with_k(together, "11x16x6 TN"), 1);  // [dA_p] += dZᵀ x
  // Stacked: q alone, k and v as one batched GEMM (their operands are equally spaced).
  EXPECT_EQ(calls_with_k(stacked, "x16 NT"), 2);
  EXPECT_EQ(calls_with_k(stacked, "x16x6 TN"), 2);
}

// ∂u_p = dy_p B_p for k and v (r = 3): their gradients are column blocks 3 apart in rows of 11
// when interleaved, whole [6, 3] matrices apart when stacked; either way the outputs are
// disjoint, and with dy and B equally spaced (allocated so above) it is one batched GEMM.
TEST_P(ProjectionGroup, ColumnBlocksOfOneBufferBatch) {
  for (Layout layout : {Layout::stacked, Layout::interleaved}) {
    const Outputs o = run(GetParam(), layout);
    EXPECT_EQ(calls_with_k(o, "6x3x8 NN"), 1) << "layout " << int(layout);
    EXPECT_EQ(calls_with_k(o, "6x5x8 NN"), 1) << "layout " << int(layout);
  }
}

// Full-rank q [8, 16], k and v [4, 16] (GQA's shapes), declared one after another, reading
// one x: grouped, then one projection at a time as with grouping off.
Outputs run_full_rank(bool grouped) {
  auto profiled = std::make_unique<ProfilingBackend>(make_backend("cpu"));
  ProfilingBackend& be = *profiled;
  Arena weights(MemoryTag::weights), act(MemoryTag::activations);
  constexpr std::array<int64_t, 3> kOut = {8, 4, 4};
  const Tensor w_all = weights.alloc({16 * kDin}), dw_all = weights.alloc({16 * kDin});
  fill(w_all, 1, 0.3f);
  fill(dw_all, 4, 0.1f);  // gradients accumulate into what is there
  const Tensor y_all = act.alloc({16 * kRows}), dy_all = act.alloc({16 * kRows});
  fill(dy_all, 20, 1.0f);
  const Tensor x = act.alloc({kRows, kDin}), dx = act.alloc({kRows, kDin});
  fill(x, 2, 1.0f);
  fill(dx, 3, 1.0f);  // garbage the backward overwrites
  std::array<Tensor, 3> ws{}, dws{}, ys{}, dys{};
  int64_t row = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    ws[i] = w_all.view(row * kDin, {kOut[i], kDin});
    dws[i] = dw_all.view(row * kDin, {kOut[i], kDin});
    ys[i] = y_all.view(row * kRows, {kRows, kOut[i]});
    dys[i] = dy_all.view(row * kRows, {kRows, kOut[i]});
    row += kOut[i];
  }
  be.reset();
  if (grouped) {
    linear_forward_shared_input(be, ys, x, ws);
    linear_backward_shared_input(be, dx, dws, dys, x, ws);
  } else {
    for (size_t i = 0; i < ws.size(); ++i) linear_forward(be, ys[i], x, ws[i]);
    for (size_t i = 0; i < ws.size(); ++i)
      linear_backward(be, dx, dws[i], dys[i], x, ws[i], /*accumulate_dx=*/i > 0);
  }
  Outputs out;
  for (const auto& [name, time] : be.times())
    if (name.starts_with("gemm")) out.gemms[name] = time.calls;
  out.tensors["y"] = host_copy(y_all);
  out.tensors["dx"] = host_copy(dx);
  out.tensors["dW"] = host_copy(dw_all);
  return out;
}

TEST(ProjectionGroupFullRank, SharedInputBatchesEqualWidthsAndKeepsTheBits) {
  const Outputs alone = run_full_rank(false), grouped = run_full_rank(true);
  for (const auto& [name, want] : alone.tensors) {
    const std::vector<float>& got = grouped.tensors.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i]) << name << "[" << i << "]";
  }
  // y = x Wᵀ and dW += dyᵀ x: q alone, k and v as one batched GEMM; dx: one per member.
  EXPECT_EQ(calls_with_k(alone, "x16 NT"), 3);
  EXPECT_EQ(calls_with_k(grouped, "x16 NT"), 2);
  EXPECT_EQ(calls_with_k(alone, "x16x6 TN"), 3);
  EXPECT_EQ(calls_with_k(grouped, "x16x6 TN"), 2);
  EXPECT_EQ(calls_with_k(grouped, "6x16x8 NN") + calls_with_k(grouped, "6x16x4 NN"), 3);
}

INSTANTIATE_TEST_SUITE_P(Kinds, ProjectionGroup,
                         ::testing::Values(BottleneckKind::svd, BottleneckKind::cola),
                         [](const auto& info) { return bottleneck_kind_name(info.param); });

}  // namespace
}  // namespace bottle
