// sys/worker_pool.h: the host workers of prepare and bench tokenize. Every item of a job runs
// once, on a worker numbered within the pool, whether claimed one or several at a time; a job runs
// while the caller goes on until wait(); the first exception comes back from wait() and the pool
// runs the next job; the workers are the same threads from job to job.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "sys/worker_pool.h"

namespace bottle::testing {
namespace {

TEST(WorkerPool, EveryItemRunsOnceOnAWorkerOfThePool) {
  for (int threads : {1, 2, 5}) {
    WorkerPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (size_t items : {size_t(0), size_t(1), size_t(3), size_t(1000)}) {
      std::vector<std::atomic<int>> runs(items);
      std::atomic<int> bad_worker = 0;
      for (size_t grain : {size_t(1), size_t(7)}) {
        for (auto& r : runs) r = 0;
        pool.run(
            items,
            [&](size_t i, int worker) {
              ++runs[i];
              if (worker < 0 || worker >= threads) ++bad_worker;
            },
            grain);
        for (size_t i = 0; i < items; ++i)
          ASSERT_EQ(runs[i], 1) << threads << " threads, grain " << grain << ", item " << i;
      }
      EXPECT_EQ(bad_worker, 0);
    }
  }
}

// start() returns before the job ends: the caller reads the next batch meanwhile.
TEST(WorkerPool, AJobRunsWhileTheCallerGoesOn) {
  WorkerPool pool(2);
  std::atomic<bool> release = false;
  std::atomic<int> done = 0;
  pool.start(2, [&](size_t, int) {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ++done;
  });
  EXPECT_EQ(done, 0);  // the caller is here while the workers wait for it
  release = true;
  pool.wait();
  EXPECT_EQ(done, 2);
}

TEST(WorkerPool, TheFirstErrorComesBackAndThePoolGoesOn) {
  WorkerPool pool(3);
  std::atomic<int> runs = 0;
  EXPECT_THROW(pool.run(100,
                        [&](size_t i, int) {
                          ++runs;
                          if (i == 7) throw std::runtime_error("item 7");
                        }),
               std::runtime_error);
  EXPECT_LT(runs, 100 + 3);
  std::atomic<int> after = 0;
  pool.run(10, [&](size_t, int) { ++after; });
  EXPECT_EQ(after, 10);
}

// The same threads from job to job (a tokenizer's thread-local caches stay warm): over 20
// jobs no more distinct threads than the pool has, and never the caller's.
TEST(WorkerPool, TheWorkersAreTheSameThreadsFromJobToJob) {
  WorkerPool pool(2);
  std::mutex mutex;
  std::set<std::thread::id> seen;
  for (int job = 0; job < 20; ++job)
    pool.run(64, [&](size_t, int) {
      std::lock_guard lock(mutex);
      seen.insert(std::this_thread::get_id());
    });
  EXPECT_LE(seen.size(), 2u);
  EXPECT_EQ(seen.count(std::this_thread::get_id()), 0u);
}

}  // namespace
}  // namespace bottle::testing
