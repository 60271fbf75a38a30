#pragma once
// The Open MPI backend of Communicator: host memory, blocking calls. Internal to the comm
// layer (it exposes mpi.h); everything else reaches it through Communicator.
//
// Open MPI's blocking calls busy-poll, so a rank waiting for a stopped or slow peer would
// burn a whole core: every call here is issued non-blocking and waited for by wait().
// all_reduce, the latency-critical one, runs over point-to-point messages (libnbc's
// non-blocking collectives are 2-10x slower than the blocking ones). Started calls run the same
// code on the group's CommThread (comm_thread.h), made on the first one; a blocking collective
// first waits for the started calls, so that every rank issues the group's collectives in one
// order (point-to-point calls match by tag and need not wait).
#include <mpi.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "comm/comm_thread.h"
#include "comm/communicator.h"

namespace bottle {

class MpiCommunicator final : public Communicator {
 public:
  // Wraps `comm`; when `owned`, the destructor frees it (unless MPI is already finalized,
  // when freeing is no longer allowed and the runtime has released it anyway).
  MpiCommunicator(MPI_Comm comm, std::string name, bool owned);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }

  void all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  void all_gather(Tensor out, Tensor in, std::string_view site) override;
  void reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  void broadcast(Tensor x, int root, std::string_view site) override;
  void send(Tensor x, int dest, int tag, std::string_view site) override;
  void recv(Tensor x, int source, int tag, std::string_view site) override;
  void send_async(Tensor x, int dest, int tag, std::string_view site) override;
  void wait_sends() override;
  void barrier() override;
  PendingCall start_all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  PendingCall start_reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  PendingCall start_all_gather(Tensor out, Tensor in, std::string_view site) override;
  PendingCall start_recv(Tensor x, int source, int tag, std::string_view site) override;
  void complete() override;
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;

  MPI_Comm handle() const { return comm_; }

 private:
  // An MPI failure means the job's state is unknown (a peer died, memory is corrupt), so
  // it ends the whole job instead of throwing into code that would wait for that peer.
  void check(int rc, const char* function, std::string_view site) const;
  // Until every request completes: polls without pause for a millisecond (collectives
  // between ranks in step complete in that time), then sleeps between polls, a pause that
  // grows with the time waited up to a millisecond, so that a long wait costs almost no CPU.
  // Past the timeout, ends the job naming `peer` (the rank of this group waited for; -1:
  // the call waits for the whole group).
  void wait(int count, MPI_Request* requests, MPI_Status* statuses, const char* function,
            std::string_view site, int peer = -1) const;
  // The timeout's error: which call waited how long for whom, then abort_job().
  [[noreturn]] void fail_stalled(const char* function, std::string_view site, int peer) const;
  // "rank R (world rank W on HOST)" for a rank of this group.
  std::string describe_rank(int rank) const;

  // The collectives in three parts: the checks of their operands (on the caller's thread,
  // returning the count MPI takes), the MPI calls (on the caller's or the group's thread), and
  // the counting, which the two share.
  int check_all_reduce(const Tensor& x, std::string_view site) const;
  int check_all_gather(const Tensor& out, const Tensor& in, std::string_view site) const;
  int check_reduce_scatter(const Tensor& out, const Tensor& in, std::string_view site) const;
  int check_recv(const Tensor& x, int source, int tag, std::string_view site) const;
  void run_all_reduce(Tensor x, int count, ReduceOp op, std::string_view site);
  void run_all_gather(Tensor out, Tensor in, int count, std::string_view site);
  void run_reduce_scatter(Tensor out, Tensor in, int count, std::string_view site);
  void run_recv(Tensor x, int count, int source, int tag, std::string_view site);
  void record(Collective kind, std::string_view site, int64_t elements, size_t element_bytes,
              double seconds);
  // Counts a call now and queues `run` on the group's thread; the handle waits for it.
  PendingCall start(Collective kind, std::string_view site, int64_t elements, size_t element_bytes,
                    std::function<void()> run);
  // Until the started calls have finished (before any blocking collective).
  void settle();
  // An error unwinds past started calls: they and every later one on the thread stop
  // (abandon_requests) instead of waiting for peers that may never come. Returns once the
  // thread is idle.
  void abandon();
  // On the thread, in wait(): cancels or releases `requests`, then throws.
  [[noreturn]] void abandon_requests(int count, MPI_Request* requests, const char* function,
                                     std::string_view site) const;

  MPI_Comm comm_;
  std::string name_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<int> world_ranks_;  // [size_] each rank's rank in MPI_COMM_WORLD
  std::vector<MPI_Request> pending_sends_;
  std::vector<char> reduce_scratch_;                // all_reduce's partner copy
  int reduce_tag_ = 32767;                          // all_reduce's messages (MPI_TAG_UB)
  std::vector<std::vector<char>> pending_buffers_;  // send_async's copies
  bool threaded_ = false;               // MPI_THREAD_MULTIPLE: started calls run on thread_
  std::unique_ptr<CommThread> thread_;  // made by the first started call
  std::mutex stats_mutex_;              // stats_ is written by both threads
  std::atomic<bool> abandoned_{false};  // abandon(): the thread's calls stop
};

// Ends the whole job from this rank, after its error has been printed: MPI_Abort, which asks
// mpirun to kill every rank and ends this process once this host's daemon has the request.
// Should it not have ended the process within kExitGraceSeconds (the daemon does not answer),
// the process exits by itself (status 1), so that a rank never outlives its error. What ends
// mpirun when a host never answers it is the launcher guard's (sys/launcher_guard.h).
inline constexpr int kExitGraceSeconds = 3;
[[noreturn]] void abort_job();

}  // namespace bottle
