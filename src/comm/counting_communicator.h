#pragma once
// A communicator that moves nothing: one rank's view of a group of `size` ranks in `bottle
// plan`'s dry run. Every call is counted in stats() exactly as the MPI and NCCL communicators
// count it (communicator.h: the same elements per call and site, so the dry run's volumes are
// bench tp's), and kept by its shape — kind, which ranks take part, elements, element size —
// so that a cost model can price each call on the links its ranks span, latency included.
// Like the real ones, a group of one rank counts nothing.
#include <compare>
#include <functional>
#include <map>
#include <string>

#include "comm/communicator.h"

namespace bottle {

// One call as the cost model prices it. Its ranks are first + i·stride, i < ranks, counted in
// the ranks of the group the dry run created (the root of any split): a collective's whole
// group, or a send's two ends.
struct CallShape {
  Collective kind = Collective::all_reduce;
  int ranks = 1, first = 0, stride = 1;
  int64_t elements = 0;
  size_t element_bytes = 4;
  bool recompute = false;  // issued while a block is recomputed (under kRecomputePhase)
  std::string site;        // the call site, as CommStats names it (phase included)
  auto operator<=>(const CallShape&) const = default;
  double bytes() const { return double(elements) * double(element_bytes); }
};

// The order of one group's calls, for a dry run's timeline (bottle plan's TP overlap): each
// call as its caller issues it, and for a started call (start_*) the moment its caller waits
// for it. A blocking call is waited for as it is issued.
class CallTimeline {
 public:
  virtual ~CallTimeline() = default;
  virtual void issued(const CallShape& call, int64_t id, bool started) = 0;
  virtual void waited(int64_t id) = 0;
};

class CountingCommunicator final : public Communicator {
 public:
  // What split() makes of this rank's group, which one process cannot learn from the other
  // ranks' colors: the new group's size, this rank's place in it, and where its members sit
  // in this group (first + i·stride).
  struct SplitGroup {
    int size = 1, rank = 0, first = 0, stride = 1;
  };
  using SplitRule = std::function<SplitGroup(int color, int key)>;
  // Without a split rule, split() fails naming the group.
  CountingCommunicator(std::string name, int size, int rank, SplitRule split_rule = {});
  // A group split from `parent`, whose members sit at `first + i·stride` of the parent's
  // ranks; its calls count into the parent's calls().
  CountingCommunicator(std::string name, const SplitGroup& group,
                       const CountingCommunicator& parent);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  // Calls per shape: this group's and those of the groups split from it.
  const std::map<CallShape, int64_t>& calls() const { return *calls_; }

  void all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  void all_gather(Tensor out, Tensor in, std::string_view site) override;
  void reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  void broadcast(Tensor x, int root, std::string_view site) override;
  void send(Tensor x, int dest, int tag, std::string_view site) override;
  void recv(Tensor x, int source, int tag, std::string_view site) override;
  void send_async(Tensor x, int dest, int tag, std::string_view site) override;
  void wait_sends() override {}
  void barrier() override;
  std::unique_ptr<Communicator> split(int color, int key, std::string name) override;
  // Started calls count as the blocking ones do; their PendingCall tells the timeline when
  // the caller waits.
  PendingCall start_all_reduce(Tensor x, ReduceOp op, std::string_view site) override;
  PendingCall start_reduce_scatter(Tensor out, Tensor in, std::string_view site) override;
  PendingCall start_all_gather(Tensor out, Tensor in, std::string_view site) override;

  // This group's own calls (not those of groups split from it) go to `timeline` while set.
  void set_timeline(CallTimeline* timeline) { timeline_ = timeline; }

 private:
  // `peer`: the other end of a send or receive (-1: a collective of the whole group).
  // `started`: a start_* call, which the caller waits for later. Returns the call's id in
  // the timeline (-1 when none is told: no timeline, or a group of one rank).
  int64_t count(Collective kind, std::string_view site, const Tensor& x, int peer = -1,
                bool started = false);
  PendingCall started(Collective kind, std::string_view site, const Tensor& x);

  std::string name_;
  int size_, rank_;
  int first_ = 0, stride_ = 1;  // this group's members in the root group's ranks
  SplitRule split_rule_;
  std::shared_ptr<std::map<CallShape, int64_t>> calls_;
  CallTimeline* timeline_ = nullptr;
  int64_t next_id_ = 0;
};

}  // namespace bottle
