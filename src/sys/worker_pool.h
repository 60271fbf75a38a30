#pragma once
// Threads that live as long as the pool and run one job at a time over items 0..n-1, each
// item taken by whichever worker claims it first: for host work that OpenMP's fork-join does
// not fit, where the workers must stay alive across jobs (their thread-local caches stay
// warm) and a job must run while the caller does something else (prepare reads the next batch
// of documents while the workers encode this one; bench tokenize times passes over a corpus).
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace bottle {

class WorkerPool {
 public:
  // item: which item; worker: which of the pool's threads (0..size()-1) runs it.
  using Job = std::function<void(size_t item, int worker)>;

  explicit WorkerPool(int threads);
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  int size() const { return threads_; }
  // The workers begin `job` over `items`, claiming `grain` consecutive items at a time (more
  // than one when items are small, so that claiming costs little beside them); what it reads
  // must stay untouched until wait() returns. One job at a time.
  void start(size_t items, Job job, size_t grain = 1);
  // Until every worker is done with the job (none still runs any of it); rethrows the first
  // exception a worker met, after which the remaining items were not started.
  void wait();
  void run(size_t items, Job job, size_t grain = 1) {
    start(items, std::move(job), grain);
    wait();
  }

 private:
  void work(int worker);

  const int threads_;
  std::mutex mutex_;
  std::condition_variable start_, done_;
  Job job_;                   // guarded by mutex_
  size_t items_ = 0;          // guarded by mutex_
  size_t grain_ = 1;          // guarded by mutex_
  uint64_t generation_ = 0;   // guarded by mutex_: one per start()
  int checked_in_ = 0;        // guarded by mutex_: workers done with this generation
  std::exception_ptr error_;  // guarded by mutex_
  std::atomic<bool> stop_ = false;
  std::atomic<size_t> next_ = 0;       // the first item of the next claim
  std::vector<std::jthread> workers_;  // last: joined before the members they use go away
};

}  // namespace bottle
