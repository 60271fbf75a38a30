#pragma once
// The NCCL backend of Communicator: device tensors, moved GPU to GPU. Internal to the comm
// layer (it exposes nccl.h and cuda_runtime.h) and to the NCCL module (nccl_module.h), whose
// entry builds it for comm_registry.cpp under parallel.comm = "nccl"; nothing else names it.
//
// A group is bootstrapped over a host communicator (MPI) of the same ranks, which also
// carries what is not on the device: host tensors (reduce_scalar's, checkpoint gathers) go
// to it unchanged. Every rank must sit on its own GPU (NCCL refuses two ranks of a group on
// one device; parallel.comm = "mpi" stages through the host for that).
//
// Streams: collectives run on a stream of their own, ordered against the backend's compute
// stream by events both ways, so that the compute after a collective sees its result. A call
// enqueues its work and returns: the host runs ahead of the GPU, and ordering stays on the
// GPU. Each call is bracketed by timing events; complete() (the training step's end) waits
// for them, polling NCCL's asynchronous error so that a failed peer is an error, and a peer
// that stopped without one is an error after the group's timeout, then adds the calls' times
// to the stats.
//
// Point-to-point: NCCL has no tags. Sends and receives between two ranks match in the order
// they are issued, so the tag is checked but not used, and a schedule must issue a pair's
// receives in the order of its sends. Sends are stream-ordered: a send_async queued on this
// rank holds back this communicator's later calls until its receiver takes it, so two ranks
// that both send to each other before either receives (messages larger than NCCL's buffers)
// wait for ever; MPI has no such limit.
#include <cuda_runtime.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "backend/backend.h"

namespace bottle {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `bootstrap`'s ranks: creates the NCCL communicator on the current CUDA
  // device (the backend chose it). `backend` (which must outlive this) gives the compute
  // stream the collectives are ordered against.
  NcclCommunicator(std::unique_ptr<Communicator> bootstrap, Backend& backend);
  // Destroys the NCCL communicator; never throws.
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return bootstrap_->rank(); }
  int size() const override { return bootstrap_->size(); }
  const std::string& name() const override { return bootstrap_->name(); }

  // f32, bf16 or i32; sum or max.
  void all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  void all_gather(Tensor out, Tensor in, std::string_view site) override;
  void reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  void broadcast(Tensor x, int root, std::string_view site) override;
  void send(Tensor x, int dest, int tag, std::string_view site) override;
  void recv(Tensor x, int source, int tag, std::string_view site) override;
  void send_async(Tensor x, int dest, int tag, std::string_view site) override;
  void wait_sends() override;
  void barrier() override;
  void complete() override;
  // Device tensors: enqueued on the comm stream like the blocking calls, but the compute
  // stream waits for them only at PendingCall::wait, so that the kernels issued in between
  // run beside them. Wait before the step's complete(), which recycles the calls' events.
  PendingCall start_all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  PendingCall start_reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  PendingCall start_all_gather(Tensor out, Tensor in, std::string_view site) override;
  // Splits the bootstrap group and creates a NCCL communicator over each part.
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  // The bootstrap group's host calls (and the pipeline's, staged) wait by it too.
  void set_timeout(std::chrono::milliseconds timeout) override {
    timeout_ = timeout;
    bootstrap_->set_timeout(timeout);
  }

 private:
  struct StreamDeleter {
    void operator()(cudaStream_t s) const noexcept;
  };
  struct EventDeleter {
    void operator()(cudaEvent_t e) const noexcept;
  };
  struct CommDeleter {
    void operator()(ncclComm_t c) const noexcept;
  };
  using Stream = std::unique_ptr<std::remove_pointer_t<cudaStream_t>, StreamDeleter>;
  using Event = std::unique_ptr<std::remove_pointer_t<cudaEvent_t>, EventDeleter>;
  using Comm = std::unique_ptr<std::remove_pointer_t<ncclComm_t>, CommDeleter>;

  // A send_async's copy of its tensor, in device memory.
  struct SendBuffer {
    void* data = nullptr;
    size_t bytes = 0;
  };

  // Fail naming the call, the group and the site; a failure aborts the NCCL communicator
  // first, so that this rank never waits in it again (a failing peer's own error then ends
  // the job through report_fatal_error).
  void check(ncclResult_t rc, const char* call, std::string_view site, std::string_view hint = {});
  void check(cudaError_t rc, const char* call, std::string_view site);
  // Fails unless the communicator is still usable (an error aborted it).
  void check_usable(std::string_view site) const;
  void abort() noexcept;

  // A call in flight: its timing events and where its time is counted.
  struct TimedCall {
    Event start, stop;
    const char* call = "";
    Collective kind = Collective::all_reduce;
    std::string site;      // as the stats recorded it
    bool started = false;  // a start_* call: its caller's wait is not the call's time
  };
  // Calls kept in flight before the oldest are completed without being asked.
  static constexpr size_t kMaxInFlight = 4096;

  // Orders the comm stream after the compute stream's work so far.
  void after_compute(std::string_view site);
  // A pair of timing events, reused from completed calls.
  TimedCall take_events(std::string_view site);
  // Runs `enqueue` (NCCL calls on the comm stream) between timing events, counts it, makes the
  // compute stream wait for it (unless a start_* call runs it: then it sets started_) and
  // returns; complete() reads its time.
  template <typename Enqueue>
  void run(const char* call, Collective kind, std::string_view site, int64_t elements, DType dtype,
           Enqueue&& enqueue);
  // Runs `call` (a blocking call's body) as a started one.
  template <typename Call>
  PendingCall started(std::string_view site, Call&& call);
  // Waits for the oldest `count` calls in flight and adds their times to the stats.
  void complete_calls(size_t count, std::string_view why);
  // Until `event` completes: polls, then sleeps between polls (see MpiCommunicator::wait),
  // checking NCCL's asynchronous errors so that a broken peer ends the wait with an error.
  void wait(cudaEvent_t event, const char* call, std::string_view site);

  std::unique_ptr<Communicator> bootstrap_;
  Backend& backend_;
  cudaStream_t compute_ = nullptr;  // the backend's; not ours to destroy
  int device_ = 0;
  // Declared before comm_, so destroyed after it: NCCL finishes its work on them first.
  Stream stream_;
  Event ready_;  // the compute stream's work so far (no timing)
  Event stop_;   // the comm stream's work so far (wait_sends, barrier)
  Comm comm_;
  std::vector<SendBuffer> pending_sends_;             // send_async's copies still in flight
  std::vector<SendBuffer> free_buffers_;              // copies whose sends completed, for reuse
  std::vector<TimedCall> in_flight_;                  // issued, not yet completed, oldest first
  std::vector<std::pair<Event, Event>> free_events_;  // completed calls' events, for reuse
  bool starting_ = false;          // within started(): run() leaves the compute stream be
  cudaEvent_t started_ = nullptr;  // the stop event of the call started() ran
};

}  // namespace bottle
