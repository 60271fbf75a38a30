#include "parallel/tp_overlap.h"

#include <climits>
#include <stdexcept>

namespace bottle {

TpTask& TpTask::operator=(TpTask&& other) noexcept {
  if (this != &other) {
    if (handle_) handle_.destroy();
    handle_ = std::exchange(other.handle_, {});
  }
  return *this;
}

// Destroying a suspended pass destroys its frame and, through the TpTask it was awaiting,
// every pass inside it: what an error leaves behind in the other half.
TpTask::~TpTask() {
  if (handle_) handle_.destroy();
}

void TpTask::get() const {
  if (!handle_) return;
  if (!handle_.done())
    throw std::logic_error(
        "a tensor-parallel pass was read before it ended (a serial pass "
        "suspended, or an overlapped one ran outside run_halves)");
  if (handle_.promise().error) std::rethrow_exception(handle_.promise().error);
}

void CollectiveAwaiter::await_suspend(std::coroutine_handle<> at) noexcept {
  half_->pending = std::move(calls_);
  half_->resume_at = at;
  ++half_->segments;
}

namespace {

bool communicates(const TensorParallel& tp) { return tp.comm != nullptr && tp.comm->size() > 1; }

}  // namespace

CollectiveAwaiter tp_all_reduce(const TensorParallel& tp, std::span<const Tensor> pieces,
                                std::string_view site) {
  std::vector<PendingCall> calls;
  if (communicates(tp)) {
    for (const Tensor& piece : pieces) {
      if (tp.half == nullptr)
        tp.comm->all_reduce(piece, ReduceOp::sum, site);
      else
        calls.push_back(tp.comm->start_all_reduce(piece, ReduceOp::sum, site));
    }
  }
  return CollectiveAwaiter(tp.half, std::move(calls));
}

CollectiveAwaiter tp_all_reduce(const TensorParallel& tp, Tensor x, std::string_view site) {
  return tp_all_reduce(tp, std::span<const Tensor>(&x, 1), site);
}

CollectiveAwaiter tp_all_gather(const TensorParallel& tp, Tensor out, Tensor in,
                                std::string_view site) {
  std::vector<PendingCall> calls;
  if (communicates(tp)) {
    if (tp.half == nullptr)
      tp.comm->all_gather(out, in, site);
    else
      calls.push_back(tp.comm->start_all_gather(out, in, site));
  }
  return CollectiveAwaiter(tp.half, std::move(calls));
}

void tp_weight_grads(const TensorParallel& tp, WeightGrad work) {
  if (tp.half == nullptr)
    work();
  else if (tp.half->index == 0)
    tp.half->weight_grads.emplace_back(tp.half->segments, std::move(work));
}

namespace {

// Half 0's weight-gradient work of every segment half 1 has also left.
void run_joined(const std::array<TpTask, 2>& tasks, std::array<TpHalf, 2>& halves) {
  const int through = tasks[1].done() ? INT_MAX : halves[1].segments;
  std::vector<std::pair<int, WeightGrad>>& queued = halves[0].weight_grads;
  size_t ran = 0;
  while (ran < queued.size() && queued[ran].first < through) queued[ran++].second();
  queued.erase(queued.begin(), queued.begin() + ptrdiff_t(ran));
}

// Waits for the half's collective, then runs the half until its next one or its end.
void resume(TpTask& task, TpHalf& half) {
  for (PendingCall& call : half.pending) call.wait();
  half.pending.clear();
  const std::coroutine_handle<> at = std::exchange(half.resume_at, {});
  if (!at) throw std::logic_error("a tensor-parallel half suspended outside a collective");
  at.resume();
  if (task.failed()) task.get();
}

}  // namespace

void run_halves(std::array<TpTask, 2>& tasks, std::array<TpHalf, 2>& halves) {
  for (TpTask& task : tasks)
    if (task.failed()) task.get();
  run_joined(tasks, halves);
  while (!tasks[0].done() || !tasks[1].done()) {
    if (!tasks[0].done()) {
      resume(tasks[0], halves[0]);
      if (tasks[1].done()) run_joined(tasks, halves);
    }
    if (!tasks[1].done()) {
      resume(tasks[1], halves[1]);
      run_joined(tasks, halves);
    }
  }
  run_joined(tasks, halves);
  for (TpTask& task : tasks) task.get();
}

}  // namespace bottle
