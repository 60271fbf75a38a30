#include "sys/worker_pool.h"

#include <algorithm>
#include <utility>

#include "core/error.h"

namespace bottle {

WorkerPool::WorkerPool(int threads) : threads_(threads) {
  BOTTLE_ASSERT(threads >= 1, "a worker pool of {} threads", threads);
  checked_in_ = threads;  // no job yet: wait() returns at once
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this, i] { work(i); });
}

WorkerPool::~WorkerPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  // workers_ joins them as it is destroyed.
}

void WorkerPool::start(size_t items, Job job, size_t grain) {
  {
    std::lock_guard lock(mutex_);
    BOTTLE_ASSERT(checked_in_ == threads_, "WorkerPool: a job started before the last ended");
    job_ = std::move(job);
    items_ = items;
    grain_ = std::max<size_t>(1, grain);
    next_ = 0;
    checked_in_ = 0;
    ++generation_;
  }
  start_.notify_all();
}

void WorkerPool::wait() {
  std::unique_lock lock(mutex_);
  done_.wait(lock, [&] { return checked_in_ == threads_; });
  job_ = nullptr;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void WorkerPool::work(int worker) {
  uint64_t seen = 0;
  for (;;) {
    const Job* job = nullptr;
    size_t items = 0, grain = 1;
    {
      std::unique_lock lock(mutex_);
      start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = &job_;
      items = items_;
      grain = grain_;
    }
    for (size_t first;
         !stop_.load(std::memory_order_relaxed) && (first = next_.fetch_add(grain)) < items;) {
      try {
        for (size_t i = first; i < std::min(first + grain, items); ++i) (*job)(i, worker);
      } catch (...) {
        std::lock_guard lock(mutex_);
        if (!error_) error_ = std::current_exception();
        next_ = items;  // the job fails: no need to run the rest
      }
    }
    {
      std::lock_guard lock(mutex_);
      ++checked_in_;
    }
    done_.notify_one();
  }
}

}  // namespace bottle
