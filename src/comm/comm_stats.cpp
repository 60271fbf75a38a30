#include <exception>

#include "comm/communicator.h"

namespace bottle {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce:
      return "all_reduce";
    case Collective::all_gather:
      return "all_gather";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::broadcast:
      return "broadcast";
    case Collective::send:
      return "send";
    case Collective::recv:
      return "recv";
    case Collective::barrier:
      return "barrier";
  }
  return "unknown";
}

namespace {

void add(CommCounter& to, const CommCounter& from) {
  to.calls += from.calls;
  to.elements += from.elements;
  to.bytes += from.bytes;
  to.seconds += from.seconds;
  to.exposed_seconds += from.exposed_seconds;
}

}  // namespace

void CommStats::record(Collective kind, std::string_view site, int64_t elements,
                       size_t element_bytes, double seconds) {
  const CommCounter one{1, elements, elements * int64_t(element_bytes), seconds, seconds};
  if (!phase_.empty()) {
    phased_site_.assign(phase_).append(site);
    site = phased_site_;
  }
  // Heterogeneous lookup: the common case (a site seen before) allocates nothing.
  auto it = by_site_.find(site);
  if (it == by_site_.end()) it = by_site_.emplace(std::string(site), CommCounter{}).first;
  add(it->second, one);
  add(by_kind_[int(kind)], one);
}

std::string CommStats::record_untimed(Collective kind, std::string_view site, int64_t elements,
                                      size_t element_bytes) {
  record(kind, site, elements, element_bytes, 0.0);
  return phase_.empty() ? std::string(site) : phased_site_;
}

void CommStats::add_exposed(Collective kind, std::string_view recorded_site, double seconds) {
  auto it = by_site_.find(recorded_site);
  if (it == by_site_.end()) return;
  it->second.exposed_seconds += seconds;
  by_kind_[int(kind)].exposed_seconds += seconds;
}

void CommStats::add_seconds(Collective kind, std::string_view recorded_site, double seconds) {
  // After a reset() the call is no longer counted: its time goes with it.
  auto it = by_site_.find(recorded_site);
  if (it == by_site_.end()) return;
  it->second.seconds += seconds;
  by_kind_[int(kind)].seconds += seconds;
}

void CommStats::reset() {
  by_site_.clear();
  for (CommCounter& c : by_kind_) c = CommCounter{};
}

CommCounter CommStats::total() const {
  CommCounter sum;
  for (const CommCounter& c : by_kind_) add(sum, c);
  return sum;
}

CommCounter CommStats::with_prefix(std::string_view prefix) const {
  CommCounter sum;
  // Sites are sorted, so those with the prefix are one contiguous run.
  for (auto it = by_site_.lower_bound(prefix);
       it != by_site_.end() && std::string_view(it->first).starts_with(prefix); ++it)
    add(sum, it->second);
  return sum;
}

PendingCall& PendingCall::operator=(PendingCall&& other) noexcept {
  if (this != &other) {
    // The call this one held finishes first: its buffers may be reused next.
    finish();
    wait_ = std::exchange(other.wait_, nullptr);
    abandon_ = std::exchange(other.abandon_, nullptr);
  }
  return *this;
}

PendingCall::~PendingCall() { finish(); }

void PendingCall::finish() noexcept {
  if (!wait_) return;
  try {
    if (std::uncaught_exceptions() > 0 && abandon_) {
      wait_ = nullptr;
      std::exchange(abandon_, nullptr)();
    } else {
      wait();
    }
  } catch (...) {
    // The error already on its way is the one to report.
  }
}

void PendingCall::wait() {
  abandon_ = nullptr;
  if (auto wait = std::exchange(wait_, nullptr)) wait();
}

CommPhase::CommPhase(Communicator* comm, std::string phase) : comm_(comm) {
  if (!comm_) return;
  previous_ = comm_->stats().phase();
  comm_->stats().set_phase(std::move(phase));
}

CommPhase::~CommPhase() {
  if (comm_) comm_->stats().set_phase(std::move(previous_));
}

double reduce_scalar(Communicator* group, double value, ReduceOp op, std::string_view site) {
  if (!group || group->size() == 1) return value;
  float v = float(value);
  group->all_reduce(Tensor{&v, {1}}, op, site);
  return v;
}

}  // namespace bottle
