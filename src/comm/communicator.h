#pragma once
// One interface for every collective bottle issues (docs/design.md §11): all_reduce, all_gather,
// reduce_scatter, broadcast, send/recv, barrier and split. Implemented on Open MPI (host
// memory), on Open MPI with device tensors staged through the host, and on NCCL (device
// memory); make_group_communicator chooses. Every call names its call site ("btp.fwd.qkv",
// "dp.grads", ...) and is counted: calls, elements and wall time, per site and per kind of
// collective, so that a bench can print exactly what each TP mode moves per block, in
// elements (the formulas) and in bytes (half as many in bf16).
//
// Elements counted per call: all_reduce and broadcast the buffer's size; all_gather the
// gathered result (size × input); reduce_scatter the input (size × output); send/recv the
// message. A communicator of size 1 moves nothing and counts nothing.
//
// Started calls (start_all_reduce, start_reduce_scatter, start_all_gather, start_recv) return
// at once with a PendingCall, so that the caller computes while the group communicates:
// Megatron's --overlap-grad-reduce, FSDP's prefetch and receives posted ahead are built on
// them. The time a call takes and the time its caller waited for it (exposed) are counted
// apart; a blocking call's whole time is exposed.
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace bottle {

enum class ReduceOp { sum, max };

enum class Collective { all_reduce, all_gather, reduce_scatter, broadcast, send, recv, barrier };
const char* collective_name(Collective c);

struct CommCounter {
  int64_t calls = 0;
  int64_t elements = 0;
  int64_t bytes = 0;
  double seconds = 0;          // the calls' own time
  double exposed_seconds = 0;  // what their callers waited: hidden = seconds - exposed
};

class CommStats {
 public:
  // Counted under phase() + site.
  void record(Collective kind, std::string_view site, int64_t elements, size_t element_bytes,
              double seconds);
  // A call counted now whose time is known later (a device communicator's calls return once
  // enqueued): returns the site as recorded (phase included), for add_seconds.
  std::string record_untimed(Collective kind, std::string_view site, int64_t elements,
                             size_t element_bytes);
  void add_seconds(Collective kind, std::string_view recorded_site, double seconds);
  // A started call's caller waited `seconds` for it (PendingCall::wait).
  void add_exposed(Collective kind, std::string_view recorded_site, double seconds);
  void reset();
  const std::map<std::string, CommCounter, std::less<>>& by_site() const { return by_site_; }
  const CommCounter& by_kind(Collective kind) const { return by_kind_[int(kind)]; }
  CommCounter total() const;
  // Sum over the sites whose name starts with `prefix`.
  CommCounter with_prefix(std::string_view prefix) const;

  // A phase prefixes every site recorded while it is set ("recompute." while backward
  // re-runs a forward), so that its collectives count apart from the first pass's.
  const std::string& phase() const { return phase_; }
  void set_phase(std::string phase) { phase_ = std::move(phase); }

 private:
  std::map<std::string, CommCounter, std::less<>> by_site_;
  std::string phase_;
  std::string phased_site_;  // scratch for phase_ + site
  CommCounter by_kind_[7];
};

// A call started by Communicator::start_*: until wait() returns, the call owns its tensors
// (the caller neither reads nor writes them). wait() rethrows the call's error. A pending call
// destroyed unwaited is waited for, so that no buffer is freed while the group still writes
// it — except while an exception unwinds the stack, when the peers may never come: then it is
// abandoned (`abandon`: the group stops the call and, as the job is ending, every later one),
// which never waits on a peer.
class PendingCall {
 public:
  PendingCall() = default;  // nothing pending (a call that has finished)
  explicit PendingCall(std::function<void()> wait, std::function<void()> abandon = {})
      : wait_(std::move(wait)), abandon_(std::move(abandon)) {}
  PendingCall(PendingCall&& other) noexcept
      : wait_(std::exchange(other.wait_, nullptr)),
        abandon_(std::exchange(other.abandon_, nullptr)) {}
  PendingCall& operator=(PendingCall&& other) noexcept;
  ~PendingCall();
  PendingCall(const PendingCall&) = delete;
  PendingCall& operator=(const PendingCall&) = delete;

  void wait();
  bool pending() const { return bool(wait_); }

 private:
  // Waits, or abandons while an exception unwinds; never throws.
  void finish() noexcept;

  std::function<void()> wait_, abandon_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What the group is for ("world", "tp", "dp", "pp"); error messages name it.
  virtual const std::string& name() const = 0;

  // In place over x (f32 or i32); every rank gets the same result.
  virtual void all_reduce(Tensor x, ReduceOp op, std::string_view site) = 0;
  // out (size() × in.numel() elements, same dtype) = the ranks' inputs in rank order.
  virtual void all_gather(Tensor out, Tensor in, std::string_view site) = 0;
  // out (in.numel() / size() elements) = this rank's block of the sum over ranks of in.
  virtual void reduce_scatter(Tensor out, Tensor in, std::string_view site) = 0;
  virtual void broadcast(Tensor x, int root, std::string_view site) = 0;
  // Blocking point-to-point. Matching send/recv pairs must use the same tag.
  virtual void send(Tensor x, int dest, int tag, std::string_view site) = 0;
  virtual void recv(Tensor x, int source, int tag, std::string_view site) = 0;
  // A send that returns at once and never waits for its receiver (pipeline schedules: only
  // receives order the stages). x is copied, so the caller may reuse it at once; the copies
  // are released by wait_sends().
  virtual void send_async(Tensor x, int dest, int tag, std::string_view site) = 0;
  virtual void wait_sends() = 0;
  virtual void barrier() = 0;

  // Started calls, with the blocking calls' contracts. A group that can progress them
  // while its caller computes (MPI: the group's communication thread; NCCL: its stream) returns
  // at once; any other runs the collective before returning (the default here), so that
  // callers are written once. Collectives on one group run in the order they are issued,
  // started or blocking: a blocking collective waits for the started calls before it (MPI's
  // rule that every rank issues a group's collectives in one order then holds whichever
  // thread runs them).
  virtual PendingCall start_all_reduce(Tensor x, ReduceOp op, std::string_view site) {
    all_reduce(x, op, site);
    return {};
  }
  virtual PendingCall start_reduce_scatter(Tensor out, Tensor in, std::string_view site) {
    reduce_scatter(out, in, site);
    return {};
  }
  virtual PendingCall start_all_gather(Tensor out, Tensor in, std::string_view site) {
    all_gather(out, in, site);
    return {};
  }
  // A receive posted ahead of its need (a pipeline stage's next input while it computes).
  // Point-to-point messages match by source and tag, so a started receive keeps no order with
  // the group's other calls: blocking sends and receives go on beside it. A group that cannot
  // receive beside its caller receives at wait() (the default here), where the caller would
  // have: a receive run at once could wait for a message whose sender waits for this rank's
  // next send (NCCL's stream, or a host-staged receive, would block it).
  virtual PendingCall start_recv(Tensor x, int source, int tag, std::string_view site) {
    return PendingCall(
        [this, x, source, tag, site = std::string(site)] { recv(x, source, tag, site); }, [] {});
  }
  // Waits until every call issued so far has finished and adds their times to the stats. A
  // host communicator's calls finish before they return, so it has nothing to do; a device
  // communicator's calls return once enqueued, and this is where a failing or vanished peer
  // is reported (an error naming the group, never a hang). Started calls finish here too. The
  // training step calls it once, at its end.
  virtual void complete() {}
  // Ranks with the same color form a new group, ordered by key (then by rank here). The new
  // group inherits this one's timeout.
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string name) = 0;

  // How long one call may wait for its peers before the group is called broken: a peer that
  // stopped (SIGSTOP, a hung host), died without its connections closing, or lost its link
  // leaves a call that would otherwise wait for ever. Past it the call ends the whole job
  // with an error naming the group, the site and the rank (and host) it waited for.
  // parallel.comm_timeout; PyTorch's NCCL default of 10 minutes otherwise.
  std::chrono::milliseconds timeout() const { return timeout_; }
  virtual void set_timeout(std::chrono::milliseconds timeout) { timeout_ = timeout; }

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
  std::chrono::milliseconds timeout_ = std::chrono::minutes(10);
};

// Sets a communicator's phase (CommStats::set_phase) for the scope; null: nothing.
class CommPhase {
 public:
  CommPhase(Communicator* comm, std::string phase);
  ~CommPhase();
  CommPhase(const CommPhase&) = delete;
  CommPhase& operator=(const CommPhase&) = delete;

 private:
  Communicator* comm_;
  std::string previous_;
};

// A scalar reduced over a group (null or one rank: the value itself), in f32 like every
// collective here: for losses, norms and timings.
double reduce_scalar(Communicator* group, double value, ReduceOp op, std::string_view site);

class Backend;

// How a process group moves device tensors. `comm` is parallel.comm: "mpi" (through the
// host: device tensors are staged through host memory, so that ranks may share a GPU) or
// "nccl" (GPU to GPU, one GPU per rank). `backend` is the backend whose tensors the group
// moves; null or a host backend: host memory, where "mpi" moves them as they are.
struct GroupTransport {
  std::string comm = "mpi";
  Backend* backend = nullptr;
};

// The communicator a group of `host_group`'s ranks uses for `transport` (collective over
// those ranks when it is NCCL's). Fails, on every rank alike, for an unknown comm, for "nccl"
// with a host backend and for "nccl" in a build without NCCL.
std::unique_ptr<Communicator> make_group_communicator(std::unique_ptr<Communicator> host_group,
                                                      const GroupTransport& transport);

// The world: every process of the job (a single process when not launched by mpirun).
// Initialises the message-passing runtime on the first call; it is finalised at exit.
Communicator& world_communicator();

// The communication libraries compiled in, one line each, e.g. "mpi: Open MPI v4.1.4"
// (for `bottle --version`; does not start the runtime).
std::vector<std::string> comm_backends();

// For apps: report an error that ends this process. Prints "bottle: error: MESSAGE" (with
// "rank R: " when the world has more than one rank) on stderr, then ends the whole job
// with a non-zero status without hanging, even when other ranks are waiting in a
// collective. Returns only when the world is a single process (the caller then exits).
void report_fatal_error(const char* kind, const char* message);

}  // namespace bottle
