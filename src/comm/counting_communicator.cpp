#include "comm/counting_communicator.h"

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace bottle {

CountingCommunicator::CountingCommunicator(std::string name, int size, int rank,
                                           SplitRule split_rule)
    : name_(std::move(name)),
      size_(size),
      rank_(rank),
      split_rule_(std::move(split_rule)),
      calls_(std::make_shared<std::map<CallShape, int64_t>>()) {
  BOTTLE_CHECK(size >= 1 && rank >= 0 && rank < size,
               "a counting group '{}' of {} ranks has no rank {}", name_, size, rank);
}

CountingCommunicator::CountingCommunicator(std::string name, const SplitGroup& group,
                                           const CountingCommunicator& parent)
    : CountingCommunicator(std::move(name), group.size, group.rank) {
  first_ = parent.first_ + group.first * parent.stride_;
  stride_ = group.stride * parent.stride_;
  calls_ = parent.calls_;
}

int64_t CountingCommunicator::count(Collective kind, std::string_view site, const Tensor& x,
                                    int peer, bool started) {
  if (size_ == 1) return -1;
  stats_.record(kind, site, x.numel(), dtype_size(x.dtype), 0.0);
  CallShape call{kind,
                 size_,
                 first_,
                 stride_,
                 x.numel(),
                 dtype_size(x.dtype),
                 !stats_.phase().empty(),
                 stats_.phase() + std::string(site)};
  if (peer >= 0) {  // the two ends of a point-to-point transfer
    call.ranks = 2;
    call.first = first_ + std::min(rank_, peer) * stride_;
    call.stride = std::abs(peer - rank_) * stride_;
  }
  ++(*calls_)[call];
  if (!timeline_) return -1;
  timeline_->issued(call, next_id_, started);
  return next_id_++;
}

PendingCall CountingCommunicator::started(Collective kind, std::string_view site,
                                          const Tensor& x) {
  const int64_t id = count(kind, site, x, -1, true);
  if (id < 0) return {};
  // The timeline may have been taken away before the caller waits (the dry run is over).
  return PendingCall(
      [this, id] {
        if (timeline_) timeline_->waited(id);
      },
      [] {});
}

PendingCall CountingCommunicator::start_all_reduce(Tensor x, ReduceOp, std::string_view site) {
  return started(Collective::all_reduce, site, x);
}
PendingCall CountingCommunicator::start_reduce_scatter(Tensor, Tensor in, std::string_view site) {
  return started(Collective::reduce_scatter, site, in);
}
PendingCall CountingCommunicator::start_all_gather(Tensor out, Tensor, std::string_view site) {
  return started(Collective::all_gather, site, out);
}

void CountingCommunicator::all_reduce(Tensor x, ReduceOp, std::string_view site) {
  count(Collective::all_reduce, site, x);
}
void CountingCommunicator::all_gather(Tensor out, Tensor, std::string_view site) {
  count(Collective::all_gather, site, out);
}
void CountingCommunicator::reduce_scatter(Tensor, Tensor in, std::string_view site) {
  count(Collective::reduce_scatter, site, in);
}
void CountingCommunicator::broadcast(Tensor x, int, std::string_view site) {
  count(Collective::broadcast, site, x);
}
void CountingCommunicator::send(Tensor x, int dest, int, std::string_view site) {
  count(Collective::send, site, x, dest);
}
void CountingCommunicator::recv(Tensor x, int source, int, std::string_view site) {
  count(Collective::recv, site, x, source);
}
void CountingCommunicator::send_async(Tensor x, int dest, int, std::string_view site) {
  count(Collective::send, site, x, dest);
}
void CountingCommunicator::barrier() {
  if (size_ == 1) return;
  stats_.record(Collective::barrier, "barrier", 0, 0, 0.0);
  ++(*calls_)[CallShape{Collective::barrier, size_, first_, stride_, 0, 0, false, "barrier"}];
}

std::unique_ptr<Communicator> CountingCommunicator::split(int color, int key, std::string name) {
  BOTTLE_CHECK(bool(split_rule_), "the dry run cannot split the '{}' group into '{}'", name_, name);
  return std::make_unique<CountingCommunicator>(std::move(name), split_rule_(color, key), *this);
}

}  // namespace bottle
