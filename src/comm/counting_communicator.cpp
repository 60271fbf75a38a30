#include "comm/counting_communicator.h"

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

CountingCommunicator::CountingCommunicator(std::string name, int size, int rank,
                                           const CountingCommunicator& parent)
    : CountingCommunicator(std::move(name), size, rank) {
  calls_ = parent.calls_;
}

void CountingCommunicator::count(Collective kind, std::string_view site, const Tensor& x) {
  if (size_ == 1) return;
  stats_.record(kind, site, x.numel(), dtype_size(x.dtype), 0.0);
  const std::string& phase = stats_.phase();
  ++(*calls_)[CallShape{kind, size_, x.numel(), dtype_size(x.dtype), !phase.empty(),
                        phase + std::string(site)}];
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
void CountingCommunicator::send(Tensor x, int, int, std::string_view site) {
  count(Collective::send, site, x);
}
void CountingCommunicator::recv(Tensor x, int, int, std::string_view site) {
  count(Collective::recv, site, x);
}
void CountingCommunicator::send_async(Tensor x, int, int, std::string_view site) {
  count(Collective::send, site, x);
}
void CountingCommunicator::barrier() {
  if (size_ == 1) return;
  stats_.record(Collective::barrier, "barrier", 0, 0, 0.0);
  ++(*calls_)[CallShape{Collective::barrier, size_, 0, 0, false, "barrier"}];
}

std::unique_ptr<Communicator> CountingCommunicator::split(int color, int key, std::string name) {
  BOTTLE_CHECK(bool(split_rule_), "the dry run cannot split the '{}' group into '{}'", name_, name);
  const auto [size, rank] = split_rule_(color, key);
  return std::make_unique<CountingCommunicator>(std::move(name), size, rank, *this);
}

}  // namespace bottle
