#pragma once
// A communicator that moves nothing: one rank's view of a group of `size` ranks in `bottle
// plan`'s dry run. Every call is counted in stats() exactly as the MPI and NCCL communicators
// count it (communicator.h: the same elements per call and site, so the dry run's volumes are
// bench tp's), and kept by its shape (kind, elements, element size) so that a cost model can
// price each call, latency included. Like the real ones, a group of one rank counts nothing.
#include <compare>
#include <functional>
#include <map>
#include <string>
#include <utility>

#include "comm/communicator.h"

namespace bottle {

// One collective as the cost model prices it.
struct CallShape {
  Collective kind = Collective::all_reduce;
  int ranks = 1;  // the group's size
  int64_t elements = 0;
  size_t element_bytes = 4;
  bool recompute = false;  // issued while a block is recomputed (under kRecomputePhase)
  std::string site;        // the call site, as CommStats names it (phase included)
  auto operator<=>(const CallShape&) const = default;
  double bytes() const { return double(elements) * double(element_bytes); }
};

class CountingCommunicator final : public Communicator {
 public:
  // split() needs every rank's color, which one process does not see: `split_rule` answers
  // it with the new group's size and this rank's place in it. Without one, split fails,
  // naming the group.
  using SplitRule = std::function<std::pair<int, int>(int color, int key)>;
  CountingCommunicator(std::string name, int size, int rank, SplitRule split_rule = {});
  // A group split from `parent`: its calls count into the parent's calls().
  CountingCommunicator(std::string name, int size, int rank, const CountingCommunicator& parent);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  // Calls per shape, this group's and those of the groups split from it.
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

 private:
  void count(Collective kind, std::string_view site, const Tensor& x);

  std::string name_;
  int size_, rank_;
  SplitRule split_rule_;
  std::shared_ptr<std::map<CallShape, int64_t>> calls_;
};

}  // namespace bottle
