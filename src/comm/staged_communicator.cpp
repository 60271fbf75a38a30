#include "comm/staged_communicator.h"

#include <chrono>

namespace bottle {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool on_device(const Tensor& t) { return t.device != Device::cpu; }

}  // namespace

StagedCommunicator::StagedCommunicator(std::unique_ptr<Communicator> host, Backend& backend)
    : host_(std::move(host)), backend_(backend) {
  BOTTLE_CHECK(host_ != nullptr, "a staged communicator needs a host communicator");
  timeout_ = host_->timeout();
}

Tensor StagedCommunicator::Staging::like(const Tensor& t) {
  const size_t bytes = t.nbytes();
  if (bytes > capacity_) {
    // Every byte is overwritten by a copy in or by the collective before it is read.
    bytes_ = std::make_unique_for_overwrite<std::byte[]>(bytes);
    capacity_ = bytes;
  }
  return Tensor{bytes_.get(), t.shape, t.dtype, Device::cpu};
}

Tensor StagedCommunicator::on_host(Tensor t, Staging& staging, bool copy) {
  if (!on_device(t)) return t;
  Tensor host = staging.like(t);
  if (copy && t.nbytes()) backend_.to_host(host.data, t);
  return host;
}

void StagedCommunicator::back_to_device(Tensor t, Tensor host) {
  if (on_device(t) && t.nbytes()) backend_.from_host(t, host.data);
}

// A group of one moves and counts nothing (communicator.h), so device tensors skip the
// staging there: all_reduce, broadcast, send and recv leave them as they are, and
// all_gather / reduce_scatter become a copy on the device. Host tensors still go to the host
// communicator, which checks and does the same.

void StagedCommunicator::all_reduce(Tensor x, ReduceOp op, std::string_view site) {
  if (size() == 1 && on_device(x)) return;
  const auto start = Clock::now();
  Tensor h = on_host(x, first_, true);
  host_->all_reduce(h, op, site);
  back_to_device(x, h);
  if (size() > 1)
    stats_.record(Collective::all_reduce, site, x.numel(), dtype_size(x.dtype),
                  seconds_since(start));
}

namespace {

// all_gather / reduce_scatter in a group of one: out = in.
void copy_alone(Backend& backend, Tensor out, Tensor in, const char* what, std::string_view site,
                const std::string& group) {
  BOTTLE_CHECK(out.dtype == in.dtype && out.numel() == in.numel(),
               "{} at '{}' on the '{}' group of one: out is {} {}, in is {} {}", what, site, group,
               dtype_name(out.dtype), out.shape.str(), dtype_name(in.dtype), in.shape.str());
  if (out.data != in.data && in.numel()) backend.copy(out, in);
}

}  // namespace

void StagedCommunicator::all_gather(Tensor out, Tensor in, std::string_view site) {
  if (size() == 1 && on_device(out) && on_device(in))
    return copy_alone(backend_, out, in, "all_gather", site, name());
  const auto start = Clock::now();
  Tensor h_in = on_host(in, first_, true);
  Tensor h_out = on_host(out, second_, false);
  host_->all_gather(h_out, h_in, site);
  back_to_device(out, h_out);
  if (size() > 1)
    stats_.record(Collective::all_gather, site, out.numel(), dtype_size(out.dtype),
                  seconds_since(start));
}

void StagedCommunicator::reduce_scatter(Tensor out, Tensor in, std::string_view site) {
  if (size() == 1 && on_device(out) && on_device(in))
    return copy_alone(backend_, out, in, "reduce_scatter", site, name());
  const auto start = Clock::now();
  Tensor h_in = on_host(in, first_, true);
  Tensor h_out = on_host(out, second_, false);
  host_->reduce_scatter(h_out, h_in, site);
  back_to_device(out, h_out);
  if (size() > 1)
    stats_.record(Collective::reduce_scatter, site, in.numel(), dtype_size(in.dtype),
                  seconds_since(start));
}

void StagedCommunicator::broadcast(Tensor x, int root, std::string_view site) {
  if (size() == 1 && on_device(x)) {
    BOTTLE_CHECK(root == 0, "broadcast at '{}' on the '{}' group: root {} in a group of one", site,
                 name(), root);
    return;
  }
  const auto start = Clock::now();
  // Only the root's contents travel; the others' are overwritten, so they need no copy in,
  // and the root's tensor does not change.
  const bool root_here = rank() == root;
  Tensor h = on_host(x, first_, root_here);
  host_->broadcast(h, root, site);
  if (!root_here) back_to_device(x, h);
  if (size() > 1)
    stats_.record(Collective::broadcast, site, x.numel(), dtype_size(x.dtype),
                  seconds_since(start));
}

void StagedCommunicator::send(Tensor x, int dest, int tag, std::string_view site) {
  if (size() == 1 && on_device(x)) {
    BOTTLE_CHECK(dest == 0 && tag >= 0,
                 "send at '{}' on the '{}' group: destination {} with tag {} in a group of one",
                 site, name(), dest, tag);
    return;
  }
  const auto start = Clock::now();
  host_->send(on_host(x, first_, true), dest, tag, site);
  if (size() > 1)
    stats_.record(Collective::send, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

void StagedCommunicator::recv(Tensor x, int source, int tag, std::string_view site) {
  if (size() == 1 && on_device(x)) {
    BOTTLE_CHECK(source == 0 && tag >= 0,
                 "recv at '{}' on the '{}' group: source {} with tag {} in a group of one", site,
                 name(), source, tag);
    return;
  }
  const auto start = Clock::now();
  Tensor h = on_host(x, first_, false);
  host_->recv(h, source, tag, site);
  back_to_device(x, h);
  if (size() > 1)
    stats_.record(Collective::recv, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

void StagedCommunicator::send_async(Tensor x, int dest, int tag, std::string_view site) {
  const auto start = Clock::now();
  // The host communicator copies what it sends, so the staging buffer is free again at once.
  host_->send_async(on_host(x, first_, true), dest, tag, site);
  if (size() > 1)
    stats_.record(Collective::send, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

void StagedCommunicator::wait_sends() {
  // Not a call of its own: the sends were counted when they were issued.
  host_->wait_sends();
}

void StagedCommunicator::barrier() {
  const auto start = Clock::now();
  host_->barrier();
  if (size() > 1) stats_.record(Collective::barrier, "barrier", 0, 0, seconds_since(start));
}

std::unique_ptr<Communicator> StagedCommunicator::split(int color, int key, std::string name) {
  return std::make_unique<StagedCommunicator>(host_->split(color, key, std::move(name)), backend_);
}

}  // namespace bottle
