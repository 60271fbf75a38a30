#include "parallel/tp_overlap.h"

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

// Blocking serially unless `start`; started under overlap.
CollectiveAwaiter all_reduce_pieces(const TensorParallel& tp, std::span<const Tensor> pieces,
                                    std::string_view site, bool start) {
  std::vector<PendingCall> calls;
  if (communicates(tp)) {
    std::optional<CommPhase> phase;  // the half's, while it starts its call
    if (tp.half) phase.emplace(tp.comm, tp.half->phase);
    for (const Tensor& piece : pieces) {
      if (tp.half == nullptr && !start)
        tp.comm->all_reduce(piece, ReduceOp::sum, site);
      else
        calls.push_back(tp.comm->start_all_reduce(piece, ReduceOp::sum, site));
    }
  }
  return CollectiveAwaiter(tp.half, std::move(calls));
}

}  // namespace

CollectiveAwaiter tp_all_reduce(const TensorParallel& tp, std::span<const Tensor> pieces,
                                std::string_view site) {
  return all_reduce_pieces(tp, pieces, site, false);
}

CollectiveAwaiter tp_all_reduce(const TensorParallel& tp, Tensor x, std::string_view site) {
  return all_reduce_pieces(tp, std::span<const Tensor>(&x, 1), site, false);
}

CollectiveAwaiter tp_start_all_reduce(const TensorParallel& tp, Tensor x, std::string_view site) {
  return all_reduce_pieces(tp, std::span<const Tensor>(&x, 1), site, true);
}

CollectiveAwaiter tp_all_gather(const TensorParallel& tp, Tensor out, Tensor in,
                                std::string_view site) {
  std::vector<PendingCall> calls;
  if (communicates(tp)) {
    std::optional<CommPhase> phase;  // the half's, while it starts its call
    if (tp.half) phase.emplace(tp.comm, tp.half->phase);
    if (tp.half == nullptr)
      tp.comm->all_gather(out, in, site);
    else
      calls.push_back(tp.comm->start_all_gather(out, in, site));
  }
  return CollectiveAwaiter(tp.half, std::move(calls));
}

TpPhase::TpPhase(const TensorParallel& tp, std::string phase) : half_(tp.half) {
  if (half_)
    previous_ = std::exchange(half_->phase, std::move(phase));
  else
    serial_.emplace(tp.comm, std::move(phase));
}

TpPhase::~TpPhase() {
  if (half_) half_->phase = std::move(previous_);
}

namespace {

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
  while (!tasks[0].done() || !tasks[1].done())
    for (int h : {0, 1})
      if (!tasks[size_t(h)].done()) resume(tasks[size_t(h)], halves[size_t(h)]);
  for (TpTask& task : tasks) task.get();
}

}  // namespace bottle
