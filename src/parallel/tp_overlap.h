#pragma once
// TP overlap (parallel.tp_overlap; plan in docs/plans/tp-overlap.md): DeepSpeed Domino's
// scheme. A micro-batch of B sequences is cut into two halves of B/2 whose block passes
// interleave on one thread, so that one half's tensor-parallel collective travels (on the
// group's communication thread, or NCCL's stream) while the other half computes.
//
// A block pass is written once, as a coroutine (TpTask) that co_awaits each collective:
//   co_await co_reduce_from_forward(tp, y, "btp.fwd.o");  // (parallel/mappings.h)
// Serially (tp.half null) the awaiter runs the blocking collective and never suspends: the
// same source gives the same bits as a plain function. Under overlap (tp.half set to the
// half's TpHalf) it starts the collective and suspends; run_halves resumes each half after
// waiting its call, alternating 0, 1, 0, 1, so that every rank issues the TP group's calls in
// one order (MPI's rule for a group's collectives).
//
// Each half is a block of its own, made for B/2 rows with its own buffers (the model's
// LlamaModel::Slot::halves), so a half's activations are the serial pass's rows bit for bit
// (a GEMM's rows do not depend on how many there are: WideningOps.GemmRowsDoNotDependOnM).
// The parameter gradients are each half's sum over its rows added one after the other, as
// under gradient accumulation: the same values up to fp32 rounding.
#include <array>
#include <coroutine>
#include <exception>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "parallel/tensor_parallel.h"

namespace bottle {

// A block pass (or a part of one) as a coroutine. Eager: it runs from its call until a
// collective suspends it, or to its end. A pass awaiting another (co_await child) continues
// when the child ends; the outermost pass's end returns to whoever resumed it (run_halves).
class [[nodiscard]] TpTask {
 public:
  struct promise_type {
    std::exception_ptr error;
    std::coroutine_handle<> continuation;  // the pass awaiting this one; none: run_halves

    TpTask get_return_object() {
      return TpTask(std::coroutine_handle<promise_type>::from_promise(*this));
    }
    std::suspend_never initial_suspend() noexcept { return {}; }
    // Suspends at its end (the frame lives until the TpTask goes), handing the thread to the
    // awaiting pass, if any.
    struct FinalAwaiter {
      bool await_ready() noexcept { return false; }
      std::coroutine_handle<> await_suspend(std::coroutine_handle<promise_type> h) noexcept {
        const std::coroutine_handle<> next = h.promise().continuation;
        return next ? next : std::noop_coroutine();
      }
      void await_resume() noexcept {}
    };
    FinalAwaiter final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() { error = std::current_exception(); }
  };

  TpTask() = default;
  TpTask(TpTask&& other) noexcept : handle_(std::exchange(other.handle_, {})) {}
  TpTask& operator=(TpTask&& other) noexcept;
  ~TpTask();
  TpTask(const TpTask&) = delete;
  TpTask& operator=(const TpTask&) = delete;

  bool done() const { return !handle_ || handle_.done(); }
  bool failed() const { return handle_ && handle_.done() && handle_.promise().error; }
  // Rethrows the pass's error. A pass that has not ended is a logic error: serial passes
  // never suspend, and overlapped ones end inside run_halves.
  void get() const;

  // co_await child: ready when the child has already ended; else this pass continues when it
  // does.
  bool await_ready() const noexcept { return done(); }
  void await_suspend(std::coroutine_handle<> parent) noexcept {
    handle_.promise().continuation = parent;
  }
  void await_resume() const { get(); }

 private:
  explicit TpTask(std::coroutine_handle<promise_type> h) : handle_(h) {}
  std::coroutine_handle<promise_type> handle_;
};

// One half's state while run_halves interleaves the two.
struct TpHalf {
  int index = 0;                        // 0 or 1: rows [index·N/2, (index+1)·N/2)
  int segments = 0;                     // collectives started so far: the current segment
  std::vector<PendingCall> pending{};   // the collective the half is suspended at (its pieces)
  std::coroutine_handle<> resume_at{};  // the innermost pass suspended there
  // The phase the half's collectives are counted under (CommStats::phase): the halves may be
  // in different ones (one still recomputing a block, the other in its backward).
  std::string phase{};
};

// Suspends a pass at a started collective (under overlap) or runs it blocking (serially).
class [[nodiscard]] CollectiveAwaiter {
 public:
  CollectiveAwaiter(TpHalf* half, std::vector<PendingCall> calls)
      : half_(half), calls_(std::move(calls)) {}
  bool await_ready() const noexcept { return half_ == nullptr; }
  void await_suspend(std::coroutine_handle<> at) noexcept;
  // Serially, waits for the calls tp_start_all_reduce started (a blocking collective leaves
  // none); under overlap they went to the half, which run_halves waited for.
  void await_resume() {
    for (PendingCall& call : calls_) call.wait();
  }

 private:
  TpHalf* half_;
  std::vector<PendingCall> calls_;
};

// The awaitable collectives of a TP pass, with the blocking ones' contracts
// (Communicator::all_reduce, all_gather): summed in place over the TP group, piece by piece
// (buffers that are not one after another: one call each, waited together). A group of one
// rank moves nothing; under overlap the pass still suspends there, so that both halves'
// segments stay the same whatever the group's size.
// (Pieces come as a span, not a braced list: g++ 12 rejects a braced list's array inside a
// co_await expression, "array used as initializer". Passes hoist such temporaries.)
CollectiveAwaiter tp_all_reduce(const TensorParallel& tp, std::span<const Tensor> pieces,
                                std::string_view site);
CollectiveAwaiter tp_all_reduce(const TensorParallel& tp, Tensor x, std::string_view site);
// The same call started now and awaited later, serially too: the pass computes between the
// start and its co_await (the TP backward's weight gradient under its input gradient's
// all-reduce, TpBackward::async), and must not touch x there.
CollectiveAwaiter tp_start_all_reduce(const TensorParallel& tp, Tensor x, std::string_view site);
// out [N, C·t] holds the ranks' in [N, C] one after another (rank-major), as all_gather.
CollectiveAwaiter tp_all_gather(const TensorParallel& tp, Tensor out, Tensor in,
                                std::string_view site);

// A pass's phase for the scope (kRecomputePhase while a block is recomputed): serially the TP
// group's (CommPhase), under overlap the half's, set on the group only while the half starts
// a call.
class TpPhase {
 public:
  TpPhase(const TensorParallel& tp, std::string phase);
  ~TpPhase();
  TpPhase(const TpPhase&) = delete;
  TpPhase& operator=(const TpPhase&) = delete;

 private:
  TpHalf* half_;
  std::optional<CommPhase> serial_;
  std::string previous_;
};

// Runs two halves' passes to their ends. tasks[h] is half h's outermost pass, already called
// (and so run to its first collective) in the order 0, 1 with tp.half = &halves[h]. Resumes
// the halves alternately, each after waiting its pending collective. An error in either half
// is rethrown at once; the other half's started call is abandoned as its PendingCall unwinds
// (never waiting on a peer).
void run_halves(std::array<TpTask, 2>& tasks, std::array<TpHalf, 2>& halves);

}  // namespace bottle
