// The comm layer under mpirun (2 and 4 ranks): exact results of every collective, the
// counters of the header's definition, and the rank layout of ProcessGroups.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "core/bf16.h"

namespace bottle {
namespace {

Tensor view(std::vector<float>& v) { return Tensor{v.data(), Shape{int64_t(v.size())}}; }
Tensor view(std::vector<int32_t>& v) {
  return Tensor{v.data(), Shape{int64_t(v.size())}, DType::i32};
}
Tensor view(std::vector<uint16_t>& v) {
  return Tensor{v.data(), Shape{int64_t(v.size())}, DType::bf16};
}

Communicator& world() { return world_communicator(); }

// The world ranks of `group`'s members, in group-rank order.
std::vector<int32_t> members(Communicator& group) {
  std::vector<int32_t> mine{world().rank()}, all(group.size());
  group.all_gather(view(all), view(mine), "test.members");
  return all;
}

TEST(Comm, WorldIsTheWholeJob) {
  EXPECT_EQ(world().name(), "world");
  EXPECT_GE(world().size(), 1);
  EXPECT_GE(world().rank(), 0);
  EXPECT_LT(world().rank(), world().size());
}

TEST(Comm, AllReduceSumF32) {
  const int r = world().rank(), n = world().size();
  std::vector<float> x(5);
  for (int i = 0; i < 5; ++i) x[i] = float(r) + 0.5f * float(i);
  world().all_reduce(view(x), ReduceOp::sum, "test.sum");
  const float ranks = float(n * (n - 1) / 2);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(x[i], ranks + float(n) * 0.5f * float(i)) << i;
}

TEST(Comm, AllReduceMaxF32) {
  const int r = world().rank(), n = world().size();
  std::vector<float> x(6);
  // Element i is largest on rank i % n; the rest are negative.
  for (int i = 0; i < 6; ++i) x[i] = r == i % n ? 100.0f + float(i) : -1.0f - float(r);
  world().all_reduce(view(x), ReduceOp::max, "test.max");
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x[i], 100.0f + float(i)) << i;
}

TEST(Comm, AllReduceI32) {
  const int r = world().rank(), n = world().size();
  std::vector<int32_t> sum{r, 1, -7 * r, 1 << 20}, max{r, -r, 3};
  world().all_reduce(view(sum), ReduceOp::sum, "test.sum");
  world().all_reduce(view(max), ReduceOp::max, "test.max");
  const int32_t ranks = n * (n - 1) / 2;
  EXPECT_EQ(sum, (std::vector<int32_t>{ranks, n, -7 * ranks, n << 20}));
  EXPECT_EQ(max, (std::vector<int32_t>{n - 1, 0, 3}));
}

TEST(Comm, AllGatherIsInRankOrder) {
  const int r = world().rank(), n = world().size();
  std::vector<float> in{10.0f * r, 10.0f * r + 1, 10.0f * r + 2}, out(3 * n, -1);
  world().all_gather(view(out), view(in), "test.gather");
  for (int q = 0; q < n; ++q)
    for (int j = 0; j < 3; ++j) EXPECT_EQ(out[3 * q + j], 10.0f * q + j) << q << " " << j;

  // bf16 travels as raw 16-bit patterns.
  std::vector<uint16_t> bits{uint16_t(0x3f80 + r), uint16_t(0xc000 + r)}, gathered(2 * n);
  world().all_gather(view(gathered), view(bits), "test.gather");
  for (int q = 0; q < n; ++q) {
    EXPECT_EQ(gathered[2 * q], 0x3f80 + q);
    EXPECT_EQ(gathered[2 * q + 1], 0xc000 + q);
  }
}

// bf16 partials are summed in fp32 and rounded once per step of the reduction, to the same
// bits on every rank; max picks the largest value.
TEST(Comm, AllReduceOfBf16) {
  // Where rounding shows: 1 + (1 + 2^-7) = 2 + 2^-7 lies half-way between two bf16 values and
  // rounds to the even one, 2.
  if (world().size() == 2) {
    std::vector<uint16_t> t{bf16_from_float(world().rank() == 0 ? 1.0f : 1.0f + 0x1p-7f)};
    world().all_reduce(view(t), ReduceOp::sum, "test.bf16.tie");
    EXPECT_EQ(bf16_to_float(t[0]), 2.0f);
  }
  const int r = world().rank(), n = world().size();
  // Quarters are exact in bf16, and so is every partial sum of them here.
  std::vector<uint16_t> x{bf16_from_float(1.0f + 0.25f * float(r)), bf16_from_float(-0.5f * r)};
  world().all_reduce(view(x), ReduceOp::sum, "test.bf16");
  EXPECT_EQ(bf16_to_float(x[0]), float(n) + 0.125f * float(n * (n - 1)));
  EXPECT_EQ(bf16_to_float(x[1]), -0.25f * float(n * (n - 1)));
  std::vector<uint16_t> y{bf16_from_float(float(r)), bf16_from_float(-float(r))};
  world().all_reduce(view(y), ReduceOp::max, "test.bf16");
  EXPECT_EQ(bf16_to_float(y[0]), float(n - 1));
  EXPECT_EQ(bf16_to_float(y[1]), 0.0f);
  // The reduce-scatter sums bf16 the same way.
  std::vector<uint16_t> in(2 * size_t(n), bf16_from_float(0.5f)), out(2);
  world().reduce_scatter(view(out), view(in), "test.bf16");
  EXPECT_EQ(bf16_to_float(out[0]), 0.5f * float(n));
  EXPECT_EQ(world().stats().by_site().at("test.bf16").bytes,
            n > 1 ? int64_t(2 * sizeof(uint16_t)) * 2 + int64_t(2 * n * sizeof(uint16_t)) : 0);
}

TEST(Comm, ReduceScatterGivesEachRankItsBlock) {
  const int r = world().rank(), n = world().size();
  std::vector<float> in(2 * n), out(2, -1);
  for (int k = 0; k < 2 * n; ++k) in[k] = float(r + k);
  world().reduce_scatter(view(out), view(in), "test.rs");
  const int ranks = n * (n - 1) / 2;
  for (int j = 0; j < 2; ++j) EXPECT_EQ(out[j], float(ranks + n * (2 * r + j))) << j;

  std::vector<int32_t> in_i(n), out_i(1);
  for (int k = 0; k < n; ++k) in_i[k] = 100 * r + k;
  world().reduce_scatter(view(out_i), view(in_i), "test.rs");
  EXPECT_EQ(out_i[0], 100 * ranks + n * r);
}

TEST(Comm, BroadcastFromTheLastRank) {
  const int r = world().rank(), root = world().size() - 1;
  std::vector<float> x(4, 0.0f);
  std::vector<uint16_t> bits(3, 0);
  if (r == root) {
    x = {1.5f, -2.0f, 3.25f, 7.0f};
    bits = {0x1234, 0xabcd, 0x0001};
  }
  world().broadcast(view(x), root, "test.bcast");
  world().broadcast(view(bits), root, "test.bcast");
  EXPECT_EQ(x, (std::vector<float>{1.5f, -2.0f, 3.25f, 7.0f}));
  EXPECT_EQ(bits, (std::vector<uint16_t>{0x1234, 0xabcd, 0x0001}));
}

// Each rank sends to the next and receives from the previous. Even ranks send first and
// odd ranks receive first, so blocking sends cannot all wait at once (needs an even size).
void ring(Communicator& c, std::vector<int32_t>& out, std::vector<int32_t>& in,
          std::string_view site) {
  const int r = c.rank(), n = c.size();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (r % 2 == 0) {
    c.send(view(out), next, 7, site);
    c.recv(view(in), prev, 7, site);
  } else {
    c.recv(view(in), prev, 7, site);
    c.send(view(out), next, 7, site);
  }
}

TEST(Comm, SendRecvRing) {
  const int r = world().rank(), n = world().size();
  if (n % 2) GTEST_SKIP() << "the ring needs an even number of ranks";
  std::vector<int32_t> out{r, 1000 + r, -r}, in(3, -1);
  ring(world(), out, in, "test.ring");
  const int prev = (r + n - 1) % n;
  EXPECT_EQ(in, (std::vector<int32_t>{prev, 1000 + prev, -prev}));
}

TEST(Comm, SplitIntoTwoGroups) {
  const int r = world().rank(), n = world().size();
  if (n < 2) GTEST_SKIP();
  // Odd and even ranks; the key reverses the order within each group.
  std::unique_ptr<Communicator> half = world().split(r % 2, -r, "half");
  EXPECT_EQ(half->name(), "half");
  std::vector<int32_t> expected;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) expected.push_back(q);
  ASSERT_EQ(half->size(), int(expected.size()));
  EXPECT_EQ(members(*half), expected);
  EXPECT_EQ(expected[half->rank()], r);

  std::vector<int32_t> sum{r};
  half->all_reduce(view(sum), ReduceOp::sum, "test.half");
  EXPECT_EQ(sum[0], std::accumulate(expected.begin(), expected.end(), 0));

  std::vector<float> b(2, 0.0f);
  if (half->rank() == 0) b = {float(r), 0.5f};
  half->broadcast(view(b), 0, "test.half");
  EXPECT_EQ(b, (std::vector<float>{float(expected[0]), 0.5f}));

  // A group's counters are its own.
  EXPECT_EQ(half->stats().by_site().count("test.half"), n > 2 ? 1u : 0u);
}

TEST(Comm, CountersFollowTheHeader) {
  const int n = world().size();
  if (n % 2) GTEST_SKIP() << "the ring needs an even number of ranks";
  // A copy of the world, so that the counters start from zero.
  std::unique_ptr<Communicator> c = world().split(0, world().rank(), "copy");
  ASSERT_EQ(c->size(), n);
  EXPECT_EQ(c->stats().total().calls, 0);

  std::vector<float> a(5, 1.0f), in3(3, 1.0f), out3(3 * n), in2(2 * n, 1.0f), out2(2), b(4);
  std::vector<int32_t> ai(3, 1), ring_out(6, 1), ring_in(6);
  c->all_reduce(view(a), ReduceOp::sum, "blk.fwd.a");
  c->all_reduce(view(ai), ReduceOp::max, "blk.fwd.a");
  c->all_gather(view(out3), view(in3), "blk.bwd.g");
  c->reduce_scatter(view(out2), view(in2), "dp.grads");
  c->broadcast(view(b), 0, "blk.fwd.b");
  ring(*c, ring_out, ring_in, "pp.act");
  c->barrier();

  const CommStats& s = c->stats();
  auto expect = [](const CommCounter& counter, int64_t calls, int64_t elements,
                   const std::string& what) {
    EXPECT_EQ(counter.calls, calls) << what;
    EXPECT_EQ(counter.elements, elements) << what;
    EXPECT_GE(counter.seconds, 0.0) << what;
  };
  ASSERT_EQ(s.by_site().size(), 6u);
  expect(s.by_site().at("blk.fwd.a"), 2, 8, "blk.fwd.a");
  expect(s.by_site().at("blk.bwd.g"), 1, 3 * n, "blk.bwd.g");  // the gathered result
  expect(s.by_site().at("dp.grads"), 1, 2 * n, "dp.grads");    // the scattered input
  expect(s.by_site().at("blk.fwd.b"), 1, 4, "blk.fwd.b");
  expect(s.by_site().at("pp.act"), 2, 12, "pp.act");  // one send and one receive
  expect(s.by_site().at("barrier"), 1, 0, "barrier");

  expect(s.by_kind(Collective::all_reduce), 2, 8, "all_reduce");
  expect(s.by_kind(Collective::all_gather), 1, 3 * n, "all_gather");
  expect(s.by_kind(Collective::reduce_scatter), 1, 2 * n, "reduce_scatter");
  expect(s.by_kind(Collective::broadcast), 1, 4, "broadcast");
  expect(s.by_kind(Collective::send), 1, 6, "send");
  expect(s.by_kind(Collective::recv), 1, 6, "recv");
  expect(s.by_kind(Collective::barrier), 1, 0, "barrier");

  expect(s.with_prefix("blk.fwd."), 3, 12, "blk.fwd.");
  expect(s.with_prefix("blk."), 4, 12 + 3 * n, "blk.");
  expect(s.with_prefix("zzz"), 0, 0, "zzz");
  const CommCounter total = s.total();
  expect(total, 8, 8 + 3 * n + 2 * n + 4 + 12, "total");
  EXPECT_GT(total.seconds, 0.0);

  c->stats().reset();
  EXPECT_TRUE(s.by_site().empty());
  expect(s.total(), 0, 0, "after reset");
  expect(s.by_kind(Collective::all_reduce), 0, 0, "all_reduce after reset");
}

TEST(Comm, CollectiveNames) {
  EXPECT_STREQ(collective_name(Collective::all_reduce), "all_reduce");
  EXPECT_STREQ(collective_name(Collective::all_gather), "all_gather");
  EXPECT_STREQ(collective_name(Collective::reduce_scatter), "reduce_scatter");
  EXPECT_STREQ(collective_name(Collective::broadcast), "broadcast");
  EXPECT_STREQ(collective_name(Collective::send), "send");
  EXPECT_STREQ(collective_name(Collective::recv), "recv");
  EXPECT_STREQ(collective_name(Collective::barrier), "barrier");
}

TEST(Comm, SizeOneGroupMovesAndCountsNothing) {
  const int r = world().rank();
  std::unique_ptr<Communicator> alone = world().split(r, 0, "alone");
  ASSERT_EQ(alone->size(), 1);
  EXPECT_EQ(alone->rank(), 0);

  std::vector<float> x{1.0f, float(r)};
  alone->all_reduce(view(x), ReduceOp::sum, "s.reduce");
  EXPECT_EQ(x, (std::vector<float>{1.0f, float(r)}));
  std::vector<float> gathered(2, -1.0f), scattered(2, -1.0f);
  alone->all_gather(view(gathered), view(x), "s.gather");
  EXPECT_EQ(gathered, x);
  alone->reduce_scatter(view(scattered), view(x), "s.scatter");
  EXPECT_EQ(scattered, x);
  alone->broadcast(view(x), 0, "s.bcast");
  alone->send(view(x), 0, 0, "s.send");
  alone->recv(view(x), 0, 0, "s.recv");
  alone->barrier();
  EXPECT_EQ(x, (std::vector<float>{1.0f, float(r)}));
  EXPECT_EQ(alone->stats().total().calls, 0);
  EXPECT_TRUE(alone->stats().by_site().empty());
}

// Every rank makes the same mistake, so every rank throws before communicating.
TEST(Comm, BadShapesThrowNamingTheSite) {
  const int n = world().size();
  auto message_of = [](auto&& call) -> std::string {
    try {
      call();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  std::vector<float> in(3), wrong(3 * n + 1), odd(2 * n + 1), one(1);
  std::vector<int32_t> ints(3 * n);
  std::vector<uint16_t> bits(2);

  std::string m = message_of([&] { world().all_gather(view(wrong), view(in), "site.gather"); });
  EXPECT_NE(m.find("site.gather"), std::string::npos) << m;
  EXPECT_NE(m.find("world"), std::string::npos) << m;
  m = message_of([&] { world().all_gather(view(ints), view(in), "site.dtype"); });
  EXPECT_NE(m.find("site.dtype"), std::string::npos) << m;
  m = message_of([&] { world().broadcast(view(in), n, "site.root"); });
  EXPECT_NE(m.find("site.root"), std::string::npos) << m;
  if (n > 1) {
    m = message_of([&] { world().reduce_scatter(view(one), view(odd), "site.rs"); });
    EXPECT_NE(m.find("site.rs"), std::string::npos) << m;
    EXPECT_NE(m.find("not a multiple"), std::string::npos) << m;
  }
  EXPECT_EQ(world().stats().by_site().count("site.gather"), 0u);
}

// Every (tp, pp, dp) whose product is the world size, e.g. at 4 ranks (2, 1, 2),
// (1, 2, 2) and (4, 1, 1).
std::vector<ParallelLayout> layouts(int world_size) {
  std::vector<ParallelLayout> all;
  for (int tp = 1; tp <= world_size; ++tp)
    for (int pp = 1; pp <= world_size; ++pp)
      for (int dp = 1; dp <= world_size; ++dp)
        if (tp * pp * dp == world_size) all.push_back(ParallelLayout{tp, pp, dp});
  return all;
}

TEST(ProcessGroups, EveryLayoutOfTheWorld) {
  const int n = world().size(), w = world().rank();
  for (const ParallelLayout& l : layouts(n)) {
    SCOPED_TRACE(testing::Message() << "tp=" << l.tp << " pp=" << l.pp << " dp=" << l.dp);
    ProcessGroups g = ProcessGroups::create(world(), l);
    EXPECT_EQ(g.world, &world());
    EXPECT_EQ(g.world_rank, w);
    EXPECT_EQ(g.tp_rank + l.tp * (g.dp_rank + l.dp * g.pp_rank), w);
    EXPECT_TRUE(g.tp_rank >= 0 && g.tp_rank < l.tp);
    EXPECT_TRUE(g.dp_rank >= 0 && g.dp_rank < l.dp);
    EXPECT_TRUE(g.pp_rank >= 0 && g.pp_rank < l.pp);
    ASSERT_TRUE(g.tp && g.dp && g.pp);
    EXPECT_EQ(g.tp->name(), "tp");
    EXPECT_EQ(g.dp->name(), "dp");
    EXPECT_EQ(g.pp->name(), "pp");
    EXPECT_EQ(g.tp->rank(), g.tp_rank);
    EXPECT_EQ(g.dp->rank(), g.dp_rank);
    EXPECT_EQ(g.pp->rank(), g.pp_rank);

    auto rank_of = [&](int t, int d, int p) { return t + l.tp * (d + l.dp * p); };
    std::vector<int32_t> tp, dp, pp;
    for (int t = 0; t < l.tp; ++t) tp.push_back(rank_of(t, g.dp_rank, g.pp_rank));
    for (int d = 0; d < l.dp; ++d) dp.push_back(rank_of(g.tp_rank, d, g.pp_rank));
    for (int p = 0; p < l.pp; ++p) pp.push_back(rank_of(g.tp_rank, g.dp_rank, p));
    ASSERT_EQ(g.tp->size(), l.tp);
    ASSERT_EQ(g.dp->size(), l.dp);
    ASSERT_EQ(g.pp->size(), l.pp);
    EXPECT_EQ(members(*g.tp), tp);
    EXPECT_EQ(members(*g.dp), dp);
    EXPECT_EQ(members(*g.pp), pp);
  }
}

TEST(ProcessGroups, TheRequestedLayoutsAreCovered) {
  const int n = world().size();
  auto has = [&](int tp, int pp, int dp) {
    for (const ParallelLayout& l : layouts(n))
      if (l.tp == tp && l.pp == pp && l.dp == dp) return true;
    return false;
  };
  if (n == 2) {
    EXPECT_TRUE(has(2, 1, 1));
  }
  if (n == 4) {
    EXPECT_TRUE(has(2, 1, 2));
    EXPECT_TRUE(has(1, 2, 2));
  }
}

TEST(ProcessGroups, WrongLayoutNamesTheWorldSize) {
  const int n = world().size();
  ParallelLayout l;
  l.tp = 2;
  l.dp = n + 1;
  try {
    ProcessGroups::create(world(), l);
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("world size " + std::to_string(n)), std::string::npos) << m;
    EXPECT_NE(m.find("= 2 × 1 × " + std::to_string(n + 1) + " = " + std::to_string(2 * (n + 1))),
              std::string::npos)
        << m;
  }
}

}  // namespace
}  // namespace bottle
