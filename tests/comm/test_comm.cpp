// The comm layer under mpirun (2 and 4 ranks): exact results of every collective, the
// counters of the header's definition, the rank layout of ProcessGroups, and device tensors
// staged through the host communicator (make_group_communicator).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/forwarding_backend.h"
#include "comm/communicator.h"
#include "comm/process_groups.h"
#include "comm/staged_communicator.h"
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

// A message of more chunks (2^18 elements) than the all-reduce keeps in flight, and a partial
// last one: every element must meet its own partners' values, blocking and started alike.
TEST(Comm, AllReduceOfManyChunksInFlight) {
  const int r = world().rank(), n = world().size();
  constexpr int64_t kCount = 17 * (int64_t(1) << 18) + 3;
  auto value = [](int rank, int64_t i) { return float((rank + 1) * (i % 1009) + rank); };
  std::unique_ptr<Communicator> started = world().split(0, r, "started");
  for (Communicator* c : {&world(), started.get()}) {
    std::vector<float> sum(static_cast<size_t>(kCount)),
        max(static_cast<size_t>(kCount));  // [kCount]
    for (int64_t i = 0; i < kCount; ++i) {
      sum[size_t(i)] = value(r, i);
      // Element i is largest on rank (i / 2^18) % n: each chunk's maximum on another rank.
      max[size_t(i)] = r == int((i >> 18) % n) ? float(i % 4099) : -1.0f - float(r);
    }
    c->start_all_reduce(view(sum), ReduceOp::sum, "test.sum").wait();
    c->all_reduce(view(max), ReduceOp::max, "test.max");
    for (int64_t i = 0; i < kCount; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, i);
      ASSERT_EQ(sum[size_t(i)], want) << c->name() << " element " << i;
      ASSERT_EQ(max[size_t(i)], float(i % 4099)) << c->name() << " element " << i;
    }
  }
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

// Issue 29, rule 2: a group destroyed while its sends are in flight (an error unwinding the
// pipeline before wait_sends) must not free what MPI still reads. The receiver posts its
// receive only after the sender's group is gone and its heap churned: it must get the bytes
// sent. 4 MB is past every eager limit, so MPI reads the sender's buffer late.
TEST(Comm, GroupDestroyedWithSendsInFlightKeepsTheirBuffers) {
  const int r = world().rank(), n = world().size();
  if (n < 2) GTEST_SKIP();
  constexpr size_t kCount = size_t(1) << 20;
  for (int round = 0; round < 3; ++round) {
    std::unique_ptr<Communicator> pair = world().split(r < 2 ? 0 : 1, r, "pair");
    std::vector<int32_t> sent(kCount);
    std::iota(sent.begin(), sent.end(), 7 * round);
    if (r == 0) {
      pair->send_async(view(sent), 1, 0, "test.in_flight");
      pair.reset();
      // Buffers freed by the destructor would be reused and overwritten here.
      for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> junk(kCount, -1);
        EXPECT_EQ(junk[kCount / 2], -1);
      }
    } else if (r == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      std::vector<int32_t> got(kCount, 0);
      pair->recv(view(got), 0, 0, "test.in_flight");
      EXPECT_TRUE(got == sent) << "round " << round << ": the receiver got other bytes";
    }
    world().barrier();
  }
}

// Issue 44: started calls give the blocking calls' results while the caller goes on — here
// calling MPI on another group meanwhile, as a training step's TP collectives do beside the DP
// buckets — run in issue order with a blocking call on the same group (which waits for them),
// count their time apart from what their caller waited, and a pending call dropped unwaited
// still finishes before its buffer goes.
TEST(Comm, StartedCallsMatchBlockingOnes) {
  const int r = world().rank(), n = world().size();
  if (n < 2) GTEST_SKIP();
  std::unique_ptr<Communicator> c = world().split(0, r, "started");
  std::unique_ptr<Communicator> other = world().split(0, r, "other");
  // Past the all-reduce's 2^18-element chunk, so that a bucket takes several rounds.
  constexpr int kBuckets = 6;
  constexpr int64_t kCount = (int64_t(1) << 18) + 5;
  auto value = [](int rank, int bucket, int64_t i) {
    return float((rank + 1) * (bucket + 1) + i % 7);
  };
  std::vector<std::vector<float>> buckets(kBuckets, std::vector<float>(size_t(kCount)));
  std::vector<PendingCall> pending;
  for (int b = 0; b < kBuckets; ++b) {
    for (int64_t i = 0; i < kCount; ++i) buckets[size_t(b)][size_t(i)] = value(r, b, i);
    pending.push_back(c->start_all_reduce(view(buckets[size_t(b)]), ReduceOp::sum, "test.bucket"));
    EXPECT_TRUE(pending.back().pending()) << "MPI without MPI_THREAD_MULTIPLE ran it at once";
  }
  std::vector<float> in(size_t(2 * n), 0.0f), scattered(2), gathered(size_t(3 * n)), mine(3);
  for (int i = 0; i < 2 * n; ++i) in[size_t(i)] = float(i + r);
  for (int i = 0; i < 3; ++i) mine[size_t(i)] = float(10 * r + i);
  PendingCall scatter = c->start_reduce_scatter(view(scattered), view(in), "test.scatter");
  PendingCall gather = c->start_all_gather(view(gathered), view(mine), "test.gather");
  // The caller's thread on another group meanwhile.
  for (int k = 0; k < 20; ++k) {
    std::vector<int32_t> one{r};
    other->all_reduce(view(one), ReduceOp::sum, "test.other");
    EXPECT_EQ(one[0], n * (n - 1) / 2);
  }
  {
    // Dropped unwaited: its destructor waits, so the buffer below is whole when it returns.
    std::vector<float> dropped(static_cast<size_t>(kCount), static_cast<float>(r));
    { PendingCall unwaited = c->start_all_reduce(view(dropped), ReduceOp::sum, "test.dropped"); }
    EXPECT_EQ(dropped[size_t(kCount - 1)], float(n * (n - 1) / 2));
  }
  // A blocking call on the group runs after the started ones on every rank.
  std::vector<int32_t> after{1};
  c->all_reduce(view(after), ReduceOp::sum, "test.after");
  EXPECT_EQ(after[0], n);
  for (PendingCall& p : pending) p.wait();
  scatter.wait();
  gather.wait();
  for (int b = 0; b < kBuckets; ++b)
    for (int64_t i : {int64_t(0), int64_t(1), kCount / 2, kCount - 1}) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += value(q, b, i);
      ASSERT_EQ(buckets[size_t(b)][size_t(i)], want) << "bucket " << b << " element " << i;
    }
  for (int i = 0; i < 2; ++i) {
    float want = 0;
    for (int q = 0; q < n; ++q) want += float(2 * r + i + q);
    EXPECT_EQ(scattered[size_t(i)], want);
  }
  for (int q = 0; q < n; ++q)
    for (int i = 0; i < 3; ++i) EXPECT_EQ(gathered[size_t(3 * q + i)], float(10 * q + i));
  c->complete();
  const CommStats& s = c->stats();
  const CommCounter& started = s.by_site().at("test.bucket");
  EXPECT_EQ(started.calls, kBuckets);
  EXPECT_EQ(started.elements, kBuckets * kCount);
  EXPECT_GT(started.seconds, 0.0);
  EXPECT_GE(started.exposed_seconds, 0.0);
  EXPECT_EQ(s.by_site().at("test.scatter").elements, 2 * n);
  EXPECT_EQ(s.by_site().at("test.gather").elements, 3 * n);
  // A blocking call's whole time is exposed.
  const CommCounter& blocking = s.by_site().at("test.after");
  EXPECT_EQ(blocking.exposed_seconds, blocking.seconds);
}

// A group that cannot receive beside its caller (NCCL's stream, host-staged MPI) receives a
// started receive at wait(), where the caller would have: a pipeline stage that posts its
// next gradient's receive before sending its activation must not block on it.
TEST(Comm, AStartedReceiveOfAGroupWithoutAThreadWaitsForWait) {
  class Log final : public Communicator {
   public:
    std::vector<std::string> calls;
    int rank() const override { return 0; }
    int size() const override { return 2; }
    const std::string& name() const override { return name_; }
    void all_reduce(Tensor, ReduceOp, std::string_view) override { calls.push_back("all_reduce"); }
    void all_gather(Tensor, Tensor, std::string_view) override { calls.push_back("all_gather"); }
    void reduce_scatter(Tensor, Tensor, std::string_view) override {
      calls.push_back("reduce_scatter");
    }
    void broadcast(Tensor, int, std::string_view) override { calls.push_back("broadcast"); }
    void send(Tensor, int, int, std::string_view) override { calls.push_back("send"); }
    void recv(Tensor, int, int tag, std::string_view) override {
      calls.push_back(fmt::format("recv {}", tag));
    }
    void send_async(Tensor, int, int tag, std::string_view) override {
      calls.push_back(fmt::format("send_async {}", tag));
    }
    void wait_sends() override {}
    void barrier() override {}
    std::unique_ptr<Communicator> split(int, int, std::string) override { return nullptr; }

   private:
    std::string name_ = "log";
  } log;
  std::vector<float> x(4), y(4);
  PendingCall gradient = log.start_recv(view(x), 1, 16, "test.gradient");
  log.send_async(view(y), 1, 0, "test.activation");
  EXPECT_EQ(log.calls, std::vector<std::string>{"send_async 0"});
  gradient.wait();
  EXPECT_EQ(log.calls, (std::vector<std::string>{"send_async 0", "recv 16"}));
  // Dropped while an error unwinds, it never receives.
  try {
    PendingCall dropped = log.start_recv(view(x), 1, 17, "test.gradient");
    throw std::runtime_error("the step failed");
  } catch (const std::runtime_error&) {
  }
  EXPECT_EQ(log.calls.size(), 2u);
}

// A started call whose peers never come, left behind by an exception (a training step failing
// on one rank), is abandoned when the stack unwinds past it: the unwinding ends in a bounded
// time instead of waiting for parallel.comm_timeout, and the error that caused it propagates.
TEST(Comm, AStartedCallUnwoundByAnErrorIsAbandoned) {
  const int r = world().rank(), n = world().size();
  if (n < 2) GTEST_SKIP();
  // Rank 0 abandons a collective half-done in it; the group is freed at the end like any.
  std::unique_ptr<Communicator> lonely = world().split(0, r, "lonely");
  lonely->set_timeout(std::chrono::seconds(120));
  if (r == 0) {
    std::vector<float> x(4, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    std::string caught;
    try {
      PendingCall call = lonely->start_all_reduce(view(x), ReduceOp::sum, "test.lonely");
      throw std::runtime_error("the step failed");
    } catch (const std::runtime_error& e) {
      caught = e.what();
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(caught, "the step failed");
    EXPECT_LT(seconds, 10.0) << "the unwinding waited for the missing peers";
  }
  world().barrier();
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

// --- Device tensors through the host communicator (StagedCommunicator), no GPU needed.

// A stand-in for a GPU: its tensors say Device::cuda and keep their bytes inverted, so that a
// communicator that handed their memory to MPI instead of staging it through to_host /
// from_host would get every sum wrong. It counts the staging copies and has no kernels.
class FakeDevice final : public ForwardingBackend {
 public:
  FakeDevice() : ForwardingBackend(nullptr) {}
  static void invert(void* dst, const void* src, size_t bytes) {
    auto* d = static_cast<unsigned char*>(dst);
    const auto* s = static_cast<const unsigned char*>(src);
    for (size_t i = 0; i < bytes; ++i) d[i] = static_cast<unsigned char>(~s[i]);
  }

  std::string_view name() const override { return "fake-device"; }
  Device device() const override { return Device::cuda; }
  void* native_stream() const override { return nullptr; }
  void synchronize() override {}
  int64_t host_waits() const override { return 0; }
  void* allocate(size_t, const char*) override { no_kernel(); }
  void deallocate(void*, size_t) override {}
  void do_to_host(void* dst, Tensor src) override {
    EXPECT_EQ(src.device, Device::cuda);
    ++to_host_calls;
    invert(dst, src.data, src.nbytes());
  }
  void do_from_host(Tensor dst, const void* src) override {
    EXPECT_EQ(dst.device, Device::cuda);
    ++from_host_calls;
    invert(dst.data, src, dst.nbytes());
  }
  // Same dtype only: all that a group of one asks for.
  void do_copy(Tensor dst, Tensor src) override {
    EXPECT_TRUE(dst.device == Device::cuda && src.device == Device::cuda);
    ASSERT_EQ(dst.dtype, src.dtype);
    ASSERT_EQ(dst.numel(), src.numel());
    std::memcpy(dst.data, src.data, src.nbytes());
    ++copies;
  }

  int to_host_calls = 0, from_host_calls = 0, copies = 0;

 protected:
  // Every other op reaches here: the fake device has no kernels.
  void around(const char*, std::span<const Tensor>, double, const std::function<void()>&) override {
    no_kernel();
  }
  [[noreturn]] static void no_kernel() { fail("the fake device has no kernels"); }
};

template <typename T>
DType dtype_of();
template <>
DType dtype_of<float>() {
  return DType::f32;
}
template <>
DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
DType dtype_of<uint16_t>() {
  return DType::bf16;
}

// A vector on the fake device.
template <typename T>
class OnDevice {
 public:
  explicit OnDevice(std::vector<T> values) : stored_(std::move(values)) {
    FakeDevice::invert(stored_.data(), stored_.data(), stored_.size() * sizeof(T));
  }
  Tensor tensor() {
    return Tensor{stored_.data(), Shape{int64_t(stored_.size())}, dtype_of<T>(), Device::cuda};
  }
  std::vector<T> values() const {
    std::vector<T> v = stored_;
    FakeDevice::invert(v.data(), v.data(), v.size() * sizeof(T));
    return v;
  }

 private:
  std::vector<T> stored_;
};

// A copy of the world staged through `device`, whose counters start from zero.
std::unique_ptr<Communicator> staged_world(FakeDevice& device, std::string name = "staged") {
  std::unique_ptr<Communicator> c =
      make_group_communicator(world().split(0, world().rank(), std::move(name)), {"mpi", &device});
  EXPECT_NE(dynamic_cast<StagedCommunicator*>(c.get()), nullptr);
  return c;
}

void expect_same_counters(const CommStats& staged, const CommStats& mpi) {
  ASSERT_EQ(staged.by_site().size(), mpi.by_site().size());
  for (const auto& [site, m] : mpi.by_site()) {
    ASSERT_EQ(staged.by_site().count(site), 1u) << site;
    const CommCounter& s = staged.by_site().at(site);
    EXPECT_EQ(s.calls, m.calls) << site;
    EXPECT_EQ(s.elements, m.elements) << site;
    EXPECT_EQ(s.bytes, m.bytes) << site;
    EXPECT_GE(s.seconds, 0.0) << site;
  }
  for (Collective kind :
       {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
        Collective::broadcast, Collective::send, Collective::recv, Collective::barrier}) {
    EXPECT_EQ(staged.by_kind(kind).calls, mpi.by_kind(kind).calls) << collective_name(kind);
    EXPECT_EQ(staged.by_kind(kind).elements, mpi.by_kind(kind).elements) << collective_name(kind);
    EXPECT_EQ(staged.by_kind(kind).bytes, mpi.by_kind(kind).bytes) << collective_name(kind);
  }
}

// Every collective on device tensors gives the MPI communicator's bits on host copies of the
// same values, and counts what it counts.
TEST(Staged, SameResultsAndCountersAsMpi) {
  const int r = world().rank(), n = world().size();
  FakeDevice device;
  std::unique_ptr<Communicator> staged = staged_world(device, "g");
  std::unique_ptr<Communicator> mpi = world().split(0, r, "g");
  EXPECT_EQ(staged->name(), "g");
  EXPECT_EQ(staged->rank(), r);
  EXPECT_EQ(staged->size(), n);

  // Runs `call` on the MPI communicator over `host` and on the staged one over a device copy
  // of it, and compares the results.
  auto same = [&](auto host, auto&& call, const char* what) {
    OnDevice<typename decltype(host)::value_type> dev(host);
    call(*mpi, view(host));
    call(*staged, dev.tensor());
    EXPECT_EQ(dev.values(), host) << what;
  };
  std::vector<float> f(7);
  for (int i = 0; i < 7; ++i) f[i] = 0.25f * float(r) + float(i) - 3.5f * float(r % 2);
  const std::vector<int32_t> ints{r, -r, 7, 1 << r};
  const std::vector<uint16_t> bits{bf16_from_float(1.0f + 0.25f * float(r)),
                                   bf16_from_float(-0.5f * float(r)), bf16_from_float(float(r))};
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max}) {
    auto reduce = [op](Communicator& c, Tensor x) { c.all_reduce(x, op, "t.reduce"); };
    same(f, reduce, "all_reduce f32");
    same(ints, reduce, "all_reduce i32");
    same(bits, reduce, "all_reduce bf16");
  }
  auto from_last = [n](Communicator& c, Tensor x) { c.broadcast(x, n - 1, "t.bcast"); };
  same(f, from_last, "broadcast f32");
  same(bits, from_last, "broadcast bf16");

  // all_gather and reduce_scatter: a device input and output each.
  auto gather_and_scatter = [&](auto in, const char* what) {
    using T = typename decltype(in)::value_type;
    std::vector<T> gathered(in.size() * size_t(n)), scattered(in.size() / size_t(n));
    OnDevice<T> dev_in(in), dev_gathered(gathered), dev_scattered(scattered);
    mpi->all_gather(view(gathered), view(in), "t.gather");
    staged->all_gather(dev_gathered.tensor(), dev_in.tensor(), "t.gather");
    EXPECT_EQ(dev_gathered.values(), gathered) << what;
    if (in.size() % size_t(n)) return;
    mpi->reduce_scatter(view(scattered), view(in), "t.scatter");
    staged->reduce_scatter(dev_scattered.tensor(), dev_in.tensor(), "t.scatter");
    EXPECT_EQ(dev_scattered.values(), scattered) << what;
  };
  std::vector<float> f4n(4 * size_t(n));
  std::vector<int32_t> i2n(2 * size_t(n));
  std::vector<uint16_t> b2n(2 * size_t(n));
  for (size_t k = 0; k < f4n.size(); ++k) f4n[k] = float(r) * 0.5f + float(k);
  for (size_t k = 0; k < i2n.size(); ++k) i2n[k] = 100 * r + int(k);
  for (size_t k = 0; k < b2n.size(); ++k) b2n[k] = bf16_from_float(0.25f * float(k + r));
  gather_and_scatter(f4n, "f32");
  gather_and_scatter(i2n, "i32");
  gather_and_scatter(b2n, "bf16");
  gather_and_scatter(f, "f32, 7 elements");

  // Point-to-point: a ring of blocking messages (even sizes) and one of sends that return at
  // once, each rank receiving from the previous one.
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  if (n % 2 == 0 && n > 1) {
    std::vector<int32_t> mpi_in(4, -1);
    OnDevice<int32_t> dev_out(ints), dev_in(std::vector<int32_t>(4, -1));
    for (Communicator* c : {mpi.get(), staged.get()}) {
      const bool on_device = c == staged.get();
      std::vector<int32_t> out = ints;
      const Tensor o = on_device ? dev_out.tensor() : view(out);
      const Tensor i = on_device ? dev_in.tensor() : view(mpi_in);
      if (r % 2 == 0) {
        c->send(o, next, 3, "t.ring");
        c->recv(i, prev, 3, "t.ring");
      } else {
        c->recv(i, prev, 3, "t.ring");
        c->send(o, next, 3, "t.ring");
      }
    }
    EXPECT_EQ(dev_in.values(), mpi_in);
    EXPECT_EQ(mpi_in, (std::vector<int32_t>{prev, -prev, 7, 1 << prev}));
  }
  if (n > 1) {
    std::vector<float> mpi_in(f.size(), -1.0f);
    OnDevice<float> dev_out(f), dev_in(std::vector<float>(f.size(), -1.0f));
    mpi->send_async(view(f), next, 5, "t.async");
    staged->send_async(dev_out.tensor(), next, 5, "t.async");
    mpi->recv(view(mpi_in), prev, 5, "t.async");
    staged->recv(dev_in.tensor(), prev, 5, "t.async");
    mpi->wait_sends();
    staged->wait_sends();
    EXPECT_EQ(dev_in.values(), mpi_in);
  }
  mpi->barrier();
  staged->barrier();

  expect_same_counters(staged->stats(), mpi->stats());
  EXPECT_EQ(staged->stats().total().calls, n > 1 ? mpi->stats().total().calls : 0);
  if (n > 1) {
    EXPECT_GT(staged->stats().total().calls, 10);
  }
  // Every device tensor went through the host; nothing was computed on the device.
  EXPECT_GT(device.to_host_calls, 0);
  EXPECT_GT(device.from_host_calls, 0);
  EXPECT_EQ(device.copies, 0);
}

// Host tensors (reduce_scalar's, checkpoint gathers) go to the host communicator as they are,
// and are counted by the staged one all the same.
TEST(Staged, HostTensorsPassStraightThrough) {
  const int r = world().rank(), n = world().size();
  FakeDevice device;
  std::unique_ptr<Communicator> staged = staged_world(device);
  std::vector<float> x{float(r), 1.0f};
  staged->all_reduce(view(x), ReduceOp::sum, "host.sum");
  EXPECT_EQ(x, (std::vector<float>{float(n * (n - 1) / 2), float(n)}));
  std::vector<int32_t> mine{r}, all(n, -1);
  staged->all_gather(view(all), view(mine), "host.gather");
  std::vector<int32_t> ranks(n);
  std::iota(ranks.begin(), ranks.end(), 0);
  EXPECT_EQ(all, ranks);
  EXPECT_EQ(reduce_scalar(staged.get(), 1.5, ReduceOp::sum, "host.scalar"), 1.5 * n);
  EXPECT_EQ(device.to_host_calls, 0);
  EXPECT_EQ(device.from_host_calls, 0);

  const auto& sites = staged->stats().by_site();
  if (n > 1) {
    EXPECT_EQ(sites.at("host.sum").elements, 2);
    EXPECT_EQ(sites.at("host.gather").elements, n);
    EXPECT_EQ(sites.at("host.scalar").calls, 1);
  } else {
    EXPECT_TRUE(sites.empty());
  }
}

TEST(Staged, SplitStagesTheNewGroup) {
  const int r = world().rank(), n = world().size();
  if (n < 2) GTEST_SKIP();
  FakeDevice device;
  std::unique_ptr<Communicator> staged = staged_world(device);
  std::unique_ptr<Communicator> half = staged->split(r % 2, -r, "half");
  ASSERT_NE(dynamic_cast<StagedCommunicator*>(half.get()), nullptr);
  EXPECT_EQ(half->name(), "half");
  std::vector<int32_t> expected;
  for (int q = n - 1; q >= 0; --q)
    if (q % 2 == r % 2) expected.push_back(q);
  ASSERT_EQ(half->size(), int(expected.size()));

  OnDevice<int32_t> mine(std::vector<int32_t>{r}), all(std::vector<int32_t>(expected.size(), -1));
  half->all_gather(all.tensor(), mine.tensor(), "half.members");
  EXPECT_EQ(all.values(), expected);
  half->all_reduce(mine.tensor(), ReduceOp::sum, "half.sum");
  EXPECT_EQ(mine.values()[0], std::accumulate(expected.begin(), expected.end(), 0));
  // Halves of two ranks are groups of one, which stage nothing.
  EXPECT_EQ(device.to_host_calls > 0, n > 2);
  // The new group's counters are its own.
  EXPECT_EQ(half->stats().by_site().count("half.sum"), n > 2 ? 1u : 0u);
  EXPECT_EQ(staged->stats().by_site().count("half.sum"), 0u);
}

// CommPhase on the staged communicator prefixes its own counters.
TEST(Staged, PhasesCountApart) {
  const int n = world().size();
  if (n < 2) GTEST_SKIP();
  FakeDevice device;
  std::unique_ptr<Communicator> staged = staged_world(device);
  OnDevice<float> x(std::vector<float>{1.0f, 2.0f});
  {
    CommPhase phase(staged.get(), "recompute.");
    staged->all_reduce(x.tensor(), ReduceOp::sum, "blk.a");
  }
  staged->all_reduce(x.tensor(), ReduceOp::sum, "blk.a");
  EXPECT_EQ(staged->stats().by_site().at("recompute.blk.a").calls, 1);
  EXPECT_EQ(staged->stats().by_site().at("blk.a").calls, 1);
  EXPECT_EQ(x.values(), (std::vector<float>{float(n * n), 2.0f * float(n * n)}));
}

// A group of one moves and counts nothing; all_gather and reduce_scatter copy on the device,
// without staging.
TEST(Staged, GroupOfOneStagesNothing) {
  const int r = world().rank();
  FakeDevice device;
  std::unique_ptr<Communicator> alone =
      make_group_communicator(world().split(r, 0, "alone"), {"mpi", &device});
  ASSERT_EQ(alone->size(), 1);
  OnDevice<float> x(std::vector<float>{1.0f, float(r)}), out(std::vector<float>(2, -1.0f));
  alone->all_reduce(x.tensor(), ReduceOp::sum, "s.reduce");
  alone->broadcast(x.tensor(), 0, "s.bcast");
  alone->send(x.tensor(), 0, 0, "s.send");
  alone->recv(x.tensor(), 0, 0, "s.recv");
  alone->barrier();
  EXPECT_EQ(x.values(), (std::vector<float>{1.0f, float(r)}));
  alone->all_gather(out.tensor(), x.tensor(), "s.gather");
  EXPECT_EQ(out.values(), x.values());
  OnDevice<float> scattered(std::vector<float>(2, -1.0f));
  alone->reduce_scatter(scattered.tensor(), x.tensor(), "s.scatter");
  EXPECT_EQ(scattered.values(), x.values());
  EXPECT_EQ(device.copies, 2);
  EXPECT_EQ(device.to_host_calls, 0);
  EXPECT_EQ(device.from_host_calls, 0);
  EXPECT_TRUE(alone->stats().by_site().empty());
  // Still checked: a root that is not in the group, an output of the wrong size.
  try {
    alone->broadcast(x.tensor(), 1, "s.root");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("s.root"), std::string::npos) << e.what();
  }
  OnDevice<float> three(std::vector<float>(3));
  EXPECT_THROW(alone->all_gather(three.tensor(), x.tensor(), "s.wrong"), Error);
}

std::string group_error(const GroupTransport& transport) {
  try {
    make_group_communicator(world().split(0, world().rank(), "g"), transport);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GroupTransport, HostBackendsKeepTheHostGroup) {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  for (Backend* backend : {static_cast<Backend*>(nullptr), cpu.get()}) {
    std::unique_ptr<Communicator> group = world().split(0, world().rank(), "g");
    Communicator* host = group.get();
    std::unique_ptr<Communicator> same =
        make_group_communicator(std::move(group), {"mpi", backend});
    EXPECT_EQ(same.get(), host);
  }
  std::unique_ptr<Communicator> group = world().split(0, world().rank(), "g");
  Communicator* host = group.get();
  EXPECT_EQ(make_group_communicator(std::move(group), {}).get(), host);
}

TEST(GroupTransport, RefusalsSayWhatToChange) {
  std::unique_ptr<Backend> cpu = make_backend("cpu");
  FakeDevice device;
  // NCCL moves device memory only, whether or not this build has it.
  for (Backend* backend : {cpu.get(), static_cast<Backend*>(nullptr)}) {
    const std::string m = group_error({"nccl", backend});
    EXPECT_NE(m.find("parallel.comm = \"nccl\" needs a GPU backend"), std::string::npos) << m;
    EXPECT_NE(m.find("training.backend = \"cuda\""), std::string::npos) << m;
    EXPECT_NE(m.find("not \"cpu\""), std::string::npos) << m;
  }
  // A build without NCCL says so for a GPU backend (with NCCL, the fake device would start it).
  bool have_nccl = false;
  for (const std::string& line : comm_backends()) have_nccl |= line.starts_with("nccl: ");
  if (!have_nccl) {
    const std::string m = group_error({"nccl", &device});
    EXPECT_NE(m.find("parallel.comm = \"nccl\": this build has no NCCL"), std::string::npos) << m;
  }
  for (Backend* backend : {static_cast<Backend*>(cpu.get()), static_cast<Backend*>(&device)}) {
    for (const char* comm : {"gloo", "", "MPI"}) {
      const std::string m = group_error({comm, backend});
      EXPECT_NE(m.find(fmt::format("parallel.comm = \"{}\": unknown", comm)), std::string::npos)
          << m;
      EXPECT_NE(m.find("\"mpi\""), std::string::npos) << m;
      EXPECT_NE(m.find("\"nccl\""), std::string::npos) << m;
    }
  }
}

// ProcessGroups moves tp, dp and pp as the transport says; the world stays as it is.
TEST(ProcessGroups, TransportStagesTheGroups) {
  const int n = world().size(), r = world().rank();
  FakeDevice device;
  ProcessGroups g = ProcessGroups::create(world(), {n, 1, 1}, {"mpi", &device});
  EXPECT_EQ(g.world, &world());
  for (Communicator* c : {g.tp.get(), g.dp.get(), g.pp.get()})
    EXPECT_NE(dynamic_cast<StagedCommunicator*>(c), nullptr) << c->name();
  EXPECT_EQ(g.tp->name(), "tp");
  OnDevice<int32_t> x(std::vector<int32_t>{r});
  g.tp->all_reduce(x.tensor(), ReduceOp::sum, "tp.sum");
  EXPECT_EQ(x.values()[0], n * (n - 1) / 2);

  ProcessGroups host = ProcessGroups::create(world(), {n, 1, 1});
  EXPECT_EQ(dynamic_cast<StagedCommunicator*>(host.tp.get()), nullptr);
}

// --- NCCL, where this build and machine have it (it skips, saying why, elsewhere).

bool have_nccl() {
  for (const std::string& line : comm_backends())
    if (line.starts_with("nccl: ")) return true;
  return false;
}

// Device memory of a backend for the scope.
class DeviceBuffer {
 public:
  DeviceBuffer(Backend& backend, int64_t elements)
      : backend_(backend),
        bytes_(size_t(elements) * sizeof(float)),
        data_(backend.allocate(bytes_, "test")),
        tensor_{data_, Shape{elements}, DType::f32, backend.device()} {}
  ~DeviceBuffer() { backend_.deallocate(data_, bytes_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Tensor tensor() const { return tensor_; }
  void set(std::vector<float> values) { backend_.from_host(tensor_, values.data()); }
  std::vector<float> get() const {
    std::vector<float> values(size_t(tensor_.numel()));
    backend_.to_host(values.data(), tensor_);
    return values;
  }

 private:
  Backend& backend_;
  size_t bytes_;
  void* data_;
  Tensor tensor_;
};

// Every rank alone in its group: ranks of a test job may share one GPU, which a NCCL group of
// several refuses. Starts NCCL, moves and counts nothing, copies all_gather / reduce_scatter
// on the device, and passes host tensors to the host communicator.
TEST(Nccl, GroupOfOneOnTheGpu) {
  if (std::string why = backend_unavailable("cuda"); !why.empty()) GTEST_SKIP() << why;
  if (!have_nccl()) GTEST_SKIP() << "this build has no NCCL";
  const int r = world().rank();
  std::unique_ptr<Backend> gpu = make_backend("cuda");
  std::unique_ptr<Communicator> alone =
      make_group_communicator(world().split(r, 0, "alone"), {"nccl", gpu.get()});
  ASSERT_EQ(alone->size(), 1);
  EXPECT_EQ(alone->name(), "alone");
  EXPECT_EQ(dynamic_cast<StagedCommunicator*>(alone.get()), nullptr);

  const std::vector<float> values{1.0f, float(r), -2.5f};
  DeviceBuffer x(*gpu, 3), gathered(*gpu, 3), scattered(*gpu, 3);
  x.set(values);
  alone->all_reduce(x.tensor(), ReduceOp::sum, "n.reduce");
  alone->broadcast(x.tensor(), 0, "n.bcast");
  alone->all_gather(gathered.tensor(), x.tensor(), "n.gather");
  alone->reduce_scatter(scattered.tensor(), x.tensor(), "n.scatter");
  alone->barrier();
  EXPECT_EQ(x.get(), values);
  EXPECT_EQ(gathered.get(), values);
  EXPECT_EQ(scattered.get(), values);
  std::vector<float> host{float(r)};
  alone->all_reduce(view(host), ReduceOp::sum, "n.host");
  EXPECT_EQ(host[0], float(r));
  EXPECT_TRUE(alone->stats().by_site().empty());

  std::unique_ptr<Communicator> again = alone->split(0, 0, "again");
  EXPECT_EQ(again->size(), 1);
  EXPECT_EQ(again->name(), "again");
}

}  // namespace
}  // namespace bottle
