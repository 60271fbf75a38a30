#include "comm/comm_thread.h"

namespace bottle {

CommThread::CommThread() : thread_([this] { run(); }) {}

CommThread::~CommThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  posted_cv_.notify_one();
  thread_.join();
}

uint64_t CommThread::post(std::function<void()> task) {
  uint64_t ticket = 0;
  {
    std::lock_guard lock(mutex_);
    ticket = ++posted_;
    queue_.emplace_back(ticket, std::move(task));
  }
  posted_cv_.notify_one();
  return ticket;
}

void CommThread::wait(uint64_t ticket) {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return done_ >= ticket; });
  if (auto it = errors_.find(ticket); it != errors_.end()) {
    const std::exception_ptr error = it->second;
    errors_.erase(it);
    std::rethrow_exception(error);
  }
}

void CommThread::drain() {
  std::unique_lock lock(mutex_);
  done_cv_.wait(lock, [&] { return done_ == posted_; });
  if (!errors_.empty()) {
    const std::exception_ptr error = errors_.begin()->second;
    errors_.clear();
    std::rethrow_exception(error);
  }
}

bool CommThread::busy() const {
  std::lock_guard lock(mutex_);
  return done_ != posted_;
}

void CommThread::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    posted_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, with nothing left to run
    auto [ticket, task] = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    std::exception_ptr error;
    try {
      task();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    if (error) errors_.emplace(ticket, error);
    done_ = ticket;
    done_cv_.notify_all();
  }
}

}  // namespace bottle
