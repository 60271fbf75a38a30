// TP overlap's scheduler (parallel/tp_overlap.h) over a communicator that records what it is
// asked: the order in which two halves issue and wait their collectives, the phase each half's
// calls are counted under, that a serial pass never suspends, and what an error leaves behind.
// The model's halves against the serial model are in test_tensor_parallel.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "parallel/tp_overlap.h"

namespace bottle {
namespace {

using Log = std::vector<std::string>;

// A TP group of two ranks that moves nothing and writes down every call: blocking ones as
// "reduce SITE", started ones as "start SITE", their waits as "wait SITE" and calls given
// up while an error unwinds as "abandon SITE".
class RecordingGroup final : public Communicator {
 public:
  explicit RecordingGroup(Log& log, int size = 2) : log_(log), size_(size) {}
  int rank() const override { return 0; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  void all_reduce(Tensor, ReduceOp, std::string_view site) override {
    log_.push_back(fmt::format("reduce {}{}", stats().phase(), site));
  }
  void all_gather(Tensor, Tensor, std::string_view site) override {
    log_.push_back(fmt::format("gather {}", site));
  }
  void reduce_scatter(Tensor, Tensor, std::string_view) override { unexpected(); }
  void broadcast(Tensor, int, std::string_view) override { unexpected(); }
  void send(Tensor, int, int, std::string_view) override { unexpected(); }
  void recv(Tensor, int, int, std::string_view) override { unexpected(); }
  void send_async(Tensor, int, int, std::string_view) override { unexpected(); }
  void wait_sends() override {}
  void barrier() override { unexpected(); }
  std::unique_ptr<Communicator> split(int, int, std::string) override { return nullptr; }

  PendingCall start_all_reduce(Tensor, ReduceOp, std::string_view site) override {
    return started(site);
  }
  PendingCall start_all_gather(Tensor, Tensor, std::string_view site) override {
    return started(site);
  }

 private:
  // Named by the group's phase and the site, as CommStats records a started call.
  PendingCall started(std::string_view site) {
    const std::string name = stats().phase() + std::string(site);
    log_.push_back("start " + name);
    return PendingCall([this, name] { log_.push_back("wait " + name); },
                       [this, name] { log_.push_back("abandon " + name); });
  }
  [[noreturn]] static void unexpected() { throw std::logic_error("not a TP pass's call"); }

  Log& log_;
  int size_;
  std::string name_ = "tp";
};

std::vector<float> g_buffer(8);
Tensor buffer() { return host_tensor(g_buffer); }

// A part of a pass in its own coroutine: what a mode's helper (a chunk, a norm) is.
TpTask chunk(const TensorParallel& tp, Log& log, std::string name, std::string site) {
  log.push_back(name + " chunk");
  const std::array<Tensor, 2> pieces{buffer(), buffer()};
  co_await tp_all_reduce(tp, pieces, site);  // two pieces, one wait
  log.push_back(name + " after " + site);
}

// A block pass as the modes write them: compute, collectives, a helper.
TpTask pass(TensorParallel tp, Log& log, std::string name) {
  log.push_back(name + " compute 0");
  co_await tp_all_reduce(tp, buffer(), "t.a");
  log.push_back(name + " compute 1");
  co_await chunk(tp, log, name, "t.b");
  co_await tp_all_gather(tp, buffer(), buffer(), "t.c");
  log.push_back(name + " tail");
}

TEST(TpOverlap, ASerialPassNeverSuspends) {
  Log log;
  RecordingGroup group(log);
  TpTask task = pass(TensorParallel{.comm = &group}, log, "s");
  ASSERT_TRUE(task.done());
  task.get();
  EXPECT_EQ(log, (Log{"s compute 0", "reduce t.a", "s compute 1", "s chunk", "reduce t.b",
                      "reduce t.b", "s after t.b", "gather t.c", "s tail"}));
}

// Half 0 and half 1 alternate segment by segment, so that every rank issues the group's calls
// in one order; each waits its own call only when it is resumed, after the other half has
// computed.
TEST(TpOverlap, HalvesAlternateAndWaitOnlyWhenResumed) {
  Log log;
  RecordingGroup group(log);
  std::array<TpHalf, 2> halves{TpHalf{.index = 0}, TpHalf{.index = 1}};
  std::array<TpTask, 2> tasks{pass(TensorParallel{.comm = &group, .half = &halves[0]}, log, "h0"),
                              pass(TensorParallel{.comm = &group, .half = &halves[1]}, log, "h1")};
  run_halves(tasks, halves);
  EXPECT_EQ(log, (Log{"h0 compute 0", "start t.a",  //
                      "h1 compute 0", "start t.a",  //
                      "wait t.a",     "h0 compute 1", "h0 chunk",     "start t.b", "start t.b",
                      "wait t.a",     "h1 compute 1", "h1 chunk",     "start t.b", "start t.b",  //
                      "wait t.b",     "wait t.b",     "h0 after t.b", "start t.c",               //
                      "wait t.b",     "wait t.b",     "h1 after t.b", "start t.c",               //
                      "wait t.c",     "h0 tail",                                                 //
                      "wait t.c",     "h1 tail"}));
  EXPECT_EQ(halves[0].segments, 3);
  EXPECT_EQ(halves[1].segments, 3);
}

// A group of one rank moves nothing, but the halves still take turns at every collective's
// place, as they would with a group.
TEST(TpOverlap, AGroupOfOneRankKeepsTheSegments) {
  Log log;
  RecordingGroup group(log, 1);
  std::array<TpHalf, 2> halves{TpHalf{.index = 0}, TpHalf{.index = 1}};
  std::array<TpTask, 2> tasks{pass(TensorParallel{.comm = &group, .half = &halves[0]}, log, "h0"),
                              pass(TensorParallel{.comm = &group, .half = &halves[1]}, log, "h1")};
  run_halves(tasks, halves);
  EXPECT_EQ(log, (Log{"h0 compute 0", "h1 compute 0", "h0 compute 1", "h0 chunk", "h1 compute 1",
                      "h1 chunk", "h0 after t.b", "h1 after t.b", "h0 tail", "h1 tail"}));
}

// A recomputation in one half and a backward in the other: each half's calls are counted under
// its own phase, and the group's phase is left as it was.
TpTask phased(TensorParallel tp, bool recompute) {
  if (recompute) {
    const TpPhase phase(tp, "recompute.");
    co_await tp_all_reduce(tp, buffer(), "t.a");
  }
  co_await tp_all_reduce(tp, buffer(), "t.b");
}

TEST(TpOverlap, EachHalfCountsUnderItsOwnPhase) {
  Log log;
  RecordingGroup group(log);
  std::array<TpHalf, 2> halves{TpHalf{.index = 0}, TpHalf{.index = 1}};
  std::array<TpTask, 2> tasks{phased(TensorParallel{.comm = &group, .half = &halves[0]}, true),
                              phased(TensorParallel{.comm = &group, .half = &halves[1]}, false)};
  run_halves(tasks, halves);
  EXPECT_EQ(log, (Log{"start recompute.t.a", "start t.b", "wait recompute.t.a", "start t.b",
                      "wait t.b", "wait t.b"}));
  EXPECT_EQ(group.stats().phase(), "");
  // Serially the phase is the group's for the scope.
  log.clear();
  phased(TensorParallel{.comm = &group}, true).get();
  EXPECT_EQ(log, (Log{"reduce recompute.t.a", "reduce t.b"}));
}

TpTask failing(TensorParallel tp, Log& log, bool fail) {
  co_await tp_all_reduce(tp, buffer(), "t.a");
  if (fail) throw std::runtime_error("half 1 failed");
  log.push_back("after t.a");
  co_await tp_all_reduce(tp, buffer(), "t.b");
}

// An error in one half reaches run_halves' caller at once; the other half's started call is
// given up as the stack unwinds (never waited on: its peers may never come), and neither half
// goes on.
TEST(TpOverlap, AnErrorInOneHalfAbandonsTheOthersCall) {
  Log log;
  RecordingGroup group(log);
  std::string caught;
  try {
    std::array<TpHalf, 2> halves{TpHalf{.index = 0}, TpHalf{.index = 1}};
    std::array<TpTask, 2> tasks{
        failing(TensorParallel{.comm = &group, .half = &halves[0]}, log, false),
        failing(TensorParallel{.comm = &group, .half = &halves[1]}, log, true)};
    run_halves(tasks, halves);
  } catch (const std::runtime_error& e) {
    caught = e.what();
  }
  EXPECT_EQ(caught, "half 1 failed");
  EXPECT_EQ(log, (Log{"start t.a", "start t.a", "wait t.a", "after t.a", "start t.b", "wait t.a",
                      "abandon t.b"}));
}

// An error before a half's first collective ends the run before anything is resumed.
TEST(TpOverlap, AnErrorBeforeTheFirstCollectiveIsRethrown) {
  Log log;
  RecordingGroup group(log);
  auto early = [](TensorParallel tp, Log& log) -> TpTask {
    log.push_back("compute");
    throw std::runtime_error("early");
    co_await tp_all_reduce(tp, buffer(), "t.a");
  };
  std::array<TpHalf, 2> halves{TpHalf{.index = 0}, TpHalf{.index = 1}};
  std::array<TpTask, 2> tasks{
      early(TensorParallel{.comm = &group, .half = &halves[0]}, log),
      failing(TensorParallel{.comm = &group, .half = &halves[1]}, log, false)};
  EXPECT_THROW(run_halves(tasks, halves), std::runtime_error);
  EXPECT_EQ(log, (Log{"compute", "start t.a"}));
}

// Reading a pass that has not ended is a logic error, not a silent half-done result.
TEST(TpOverlap, ReadingAnUnfinishedPassIsAnError) {
  Log log;
  RecordingGroup group(log);
  TpHalf half;
  TpTask task = pass(TensorParallel{.comm = &group, .half = &half}, log, "h0");
  EXPECT_FALSE(task.done());
  EXPECT_THROW(task.get(), std::logic_error);
}

}  // namespace
}  // namespace bottle
