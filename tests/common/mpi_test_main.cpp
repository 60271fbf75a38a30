// GoogleTest main for tests run by mpirun. Every rank runs every test (the tests issue
// collectives, so all ranks must take the same path). Rank 0 prints the usual report; the
// other ranks print only their failures, prefixed with their rank, so that a failure on
// rank 3 is not lost and a passing run is not printed four times. Every rank exits
// non-zero when a test failed on any rank, so mpirun's status is the job's.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>

#include "comm/communicator.h"

namespace {

class FailurePrinter : public testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}

  // GoogleTest holds its lock while reporting a result, so the test's name is noted here
  // rather than asked for (current_test_info() would deadlock).
  void OnTestStart(const testing::TestInfo& test) override {
    test_ = fmt::format("{}.{}", test.test_suite_name(), test.name());
  }

  void OnTestPartResult(const testing::TestPartResult& result) override {
    if (!result.failed()) return;
    const std::string line = fmt::format("[rank {}] {}: {}:{}: Failure\n{}\n", rank_, test_,
                                         result.file_name() ? result.file_name() : "?",
                                         result.line_number(), result.message());
    std::fputs(line.c_str(), stdout);
    std::fflush(stdout);
  }

 private:
  int rank_;
  std::string test_;
};

}  // namespace

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  bottle::Communicator& world = bottle::world_communicator();
  if (world.rank() != 0) {
    testing::TestEventListeners& listeners = testing::UnitTest::GetInstance()->listeners();
    std::unique_ptr<testing::TestEventListener> silenced(
        listeners.Release(listeners.default_result_printer()));
    // GoogleTest takes ownership of appended listeners.
    listeners.Append(std::make_unique<FailurePrinter>(world.rank()).release());
  }
  int32_t failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  world.all_reduce(bottle::Tensor{&failed, bottle::Shape{1}, bottle::DType::i32},
                   bottle::ReduceOp::max, "test.result");
  if (failed && world.rank() == 0 && world.size() > 1)
    std::fputs("[rank 0] a test failed on at least one rank\n", stdout);
  return failed;
}
