#include "comm/nccl_communicator.h"

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cstdint>
#include <thread>

namespace bottle {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

bool on_device(const Tensor& t) { return t.device != Device::cpu; }

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::f32:
      return ncclFloat32;
    case DType::bf16:
      return ncclBfloat16;
    case DType::i32:
      return ncclInt32;
    case DType::f64:
      return ncclFloat64;
  }
  return ncclFloat32;
}

// A call on host tensors goes to the bootstrap communicator, which counts it there; it is
// counted here too, so that this communicator's stats (and CommPhase on it) see every call.
template <typename Call>
void on_host(Communicator& self, Collective kind, std::string_view site, int64_t elements,
             DType dtype, Call&& call) {
  const auto start = Clock::now();
  call();
  if (self.size() > 1)
    self.stats().record(kind, site, elements, dtype_size(dtype), seconds_since(start));
}

void check_data(const Tensor& t, const char* what, std::string_view site,
                const std::string& group) {
  BOTTLE_CHECK(t.numel() == 0 || t.data != nullptr,
               "{} at '{}' on the '{}' group: tensor of shape {} has no data", what, site, group,
               t.shape.str());
}

// NCCL's unique id travels over the bootstrap as the i32 tensor it fits in exactly.
using IdWords = std::array<int32_t, sizeof(ncclUniqueId) / sizeof(int32_t)>;
static_assert(sizeof(IdWords) == sizeof(ncclUniqueId));

constexpr std::string_view kInit = "init";

}  // namespace

void NcclCommunicator::StreamDeleter::operator()(cudaStream_t s) const noexcept {
  cudaStreamDestroy(s);
}
void NcclCommunicator::EventDeleter::operator()(cudaEvent_t e) const noexcept {
  cudaEventDestroy(e);
}
void NcclCommunicator::CommDeleter::operator()(ncclComm_t c) const noexcept { ncclCommDestroy(c); }

NcclCommunicator::NcclCommunicator(std::unique_ptr<Communicator> bootstrap, Backend& backend)
    : bootstrap_(std::move(bootstrap)),
      backend_(backend),
      compute_(static_cast<cudaStream_t>(backend.native_stream())) {
  BOTTLE_CHECK(bootstrap_ != nullptr, "a NCCL communicator needs a bootstrap communicator");
  timeout_ = bootstrap_->timeout();
  BOTTLE_CHECK(backend.device() != Device::cpu,
               "NCCL on the '{}' group needs a GPU backend, not {} (host memory)", name(),
               backend.name());
  check(cudaGetDevice(&device_), "cudaGetDevice", kInit);

  cudaStream_t stream = nullptr;
  // Non-blocking: the legacy default stream must not serialise it with everything else.
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags",
        kInit);
  stream_.reset(stream);
  auto make_event = [&](unsigned flags) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, flags), "cudaEventCreateWithFlags", kInit);
    return Event(event);
  };
  ready_ = make_event(cudaEventDisableTiming);
  stop_ = make_event(cudaEventDisableTiming);

  ncclUniqueId id{};
  if (rank() == 0) check(ncclGetUniqueId(&id), "ncclGetUniqueId", kInit);
  IdWords words = std::bit_cast<IdWords>(id);
  bootstrap_->broadcast(host_tensor(words), 0, "nccl.init");
  id = std::bit_cast<ncclUniqueId>(words);
  ncclComm_t comm = nullptr;
  const ncclResult_t rc = ncclCommInitRank(&comm, size(), id, rank());
  // Most often two ranks of the group on one GPU, which NCCL refuses.
  check(rc, "ncclCommInitRank", kInit,
        rc == ncclInvalidUsage
            ? "; ranks that share a GPU need parallel.comm = \"mpi\" (staged through the host)"
            : "");
  comm_.reset(comm);
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) {
    // Destroying waits for the communicator's outstanding work, which never ends when a
    // peer is gone or never receives a pending send: abort instead of hanging at exit. Calls
    // still in flight on a healthy group are waited for first (with the timeout), so that
    // peers inside the same collective are not left in it.
    ncclResult_t async = ncclSuccess;
    bool broken = ncclCommGetAsyncError(comm_.get(), &async) != ncclSuccess ||
                  (async != ncclSuccess && async != ncclInProgress);
    if (!broken && cudaStreamQuery(stream_.get()) != cudaSuccess) {
      try {
        complete();
        broken = cudaStreamQuery(stream_.get()) != cudaSuccess;
      } catch (const Error&) {
        broken = true;  // complete() has aborted already; nobody is left to tell
      }
    }
    if (broken) abort();
  }
  comm_.reset();
  for (const auto* buffers : {&pending_sends_, &free_buffers_})
    for (const SendBuffer& b : *buffers) cudaFreeAsync(b.data, stream_.get());
  cudaStreamSynchronize(stream_.get());
  // A failure here has nobody to report to; leave no error behind for the next CUDA call.
  cudaGetLastError();
}

void NcclCommunicator::abort() noexcept {
  if (comm_) ncclCommAbort(comm_.release());
}

void NcclCommunicator::check(ncclResult_t rc, const char* call, std::string_view site,
                             std::string_view hint) {
  if (rc == ncclSuccess) return;
  // NCCL's last error says what its result code does not (which peer, which transport).
  const std::string detail = ncclGetLastError(comm_.get());
  abort();
  fail("{} on the '{}' group (site '{}') failed: {}{}{}", call, name(), site,
       ncclGetErrorString(rc), detail.empty() ? "" : " (" + detail + ")", hint);
}

void NcclCommunicator::check(cudaError_t rc, const char* call, std::string_view site) {
  if (rc == cudaSuccess) return;
  // A CUDA failure halfway through leaves the peers waiting in the collective.
  abort();
  fail("{} on the '{}' group (site '{}', CUDA device {}) failed: {}: {}", call, name(), site,
       device_, cudaGetErrorName(rc), cudaGetErrorString(rc));
}

void NcclCommunicator::check_usable(std::string_view site) const {
  BOTTLE_CHECK(comm_ != nullptr,
               "NCCL at '{}' on the '{}' group: the communicator was aborted by an earlier error",
               site, name());
}

void NcclCommunicator::after_compute(std::string_view site) {
  check(cudaEventRecord(ready_.get(), compute_), "cudaEventRecord", site);
  check(cudaStreamWaitEvent(stream_.get(), ready_.get(), 0), "cudaStreamWaitEvent", site);
}

NcclCommunicator::TimedCall NcclCommunicator::take_events(std::string_view site) {
  TimedCall call;
  if (!free_events_.empty()) {
    call.start = std::move(free_events_.back().first);
    call.stop = std::move(free_events_.back().second);
    free_events_.pop_back();
    return call;
  }
  for (Event* e : {&call.start, &call.stop}) {
    cudaEvent_t event = nullptr;
    check(cudaEventCreateWithFlags(&event, cudaEventDefault), "cudaEventCreateWithFlags", site);
    e->reset(event);
  }
  return call;
}

template <typename Enqueue>
void NcclCommunicator::run(const char* call, Collective kind, std::string_view site,
                           int64_t elements, DType dtype, Enqueue&& enqueue) {
  // A long run of calls that nobody completes (a caller outside the training step) keeps a
  // bounded number of events: the oldest half is completed first.
  if (in_flight_.size() >= kMaxInFlight) complete_calls(in_flight_.size() / 2, "in flight");
  TimedCall timed = take_events(site);
  after_compute(site);
  check(cudaEventRecord(timed.start.get(), stream_.get()), "cudaEventRecord", site);
  check(enqueue(), call, site);
  check(cudaEventRecord(timed.stop.get(), stream_.get()), "cudaEventRecord", site);
  // The compute stream's next kernels read the result; the host goes on at once, and the
  // call's time and errors are read when the step completes it. A started call's reader waits
  // later (started()).
  if (starting_)
    started_ = timed.stop.get();
  else
    check(cudaStreamWaitEvent(compute_, timed.stop.get(), 0), "cudaStreamWaitEvent", site);
  timed.call = call;
  timed.kind = kind;
  timed.started = starting_;
  timed.site = stats_.record_untimed(kind, site, elements, dtype_size(dtype));
  in_flight_.push_back(std::move(timed));
}

void NcclCommunicator::complete_calls(size_t count, std::string_view why) {
  for (size_t i = 0; i < count && i < in_flight_.size(); ++i) {
    TimedCall& c = in_flight_[i];
    wait(c.stop.get(), c.call, c.site);
    float ms = 0;
    check(cudaEventElapsedTime(&ms, c.start.get(), c.stop.get()), "cudaEventElapsedTime", why);
    stats_.add_seconds(c.kind, c.site, double(ms) / 1e3);
    // The compute stream waited for a blocking call where it was issued: all of it exposed.
    if (!c.started) stats_.add_exposed(c.kind, c.site, double(ms) / 1e3);
    free_events_.emplace_back(std::move(c.start), std::move(c.stop));
  }
  in_flight_.erase(in_flight_.begin(),
                   in_flight_.begin() + std::ptrdiff_t(std::min(count, in_flight_.size())));
}

void NcclCommunicator::complete() {
  if (!comm_) return;
  complete_calls(in_flight_.size(), "complete");
}

void NcclCommunicator::wait(cudaEvent_t event, const char* call, std::string_view site) {
  constexpr auto kSpin = std::chrono::milliseconds(1);
  constexpr auto kLongestPause = std::chrono::microseconds(1000);
  const auto start = Clock::now();
  for (;;) {
    const cudaError_t rc = cudaEventQuery(event);
    if (rc == cudaSuccess) return;
    if (rc != cudaErrorNotReady) check(rc, call, site);
    // A peer that failed or left shows here, not in the event, which would never complete.
    ncclResult_t async = ncclSuccess;
    check(ncclCommGetAsyncError(comm_.get(), &async), "ncclCommGetAsyncError", site);
    if (async != ncclSuccess && async != ncclInProgress) check(async, call, site);
    const auto waited = Clock::now() - start;
    // A peer that stopped without an error (killed, hung) leaves the collective waiting for
    // ever: after the group's timeout the communicator is aborted and the call named.
    if (waited > timeout_) {
      abort();
      fail(
          "{} on the '{}' group (site '{}') did not complete within {:g} s "
          "(parallel.comm_timeout): "
          "a peer of the group stopped or is stuck (NCCL shows no error)",
          call, name(), site, std::chrono::duration<double>(timeout_).count());
    }
    if (waited < kSpin) continue;
    std::this_thread::sleep_for(std::min<Clock::duration>(
        waited / 8, std::chrono::duration_cast<Clock::duration>(kLongestPause)));
  }
}

template <typename Call>
PendingCall NcclCommunicator::started(std::string_view site, Call&& call) {
  starting_ = true;
  started_ = nullptr;
  try {
    call();
  } catch (...) {
    starting_ = false;
    throw;
  }
  starting_ = false;
  // Host tensors and groups of one went the blocking way: nothing is pending.
  cudaEvent_t done = std::exchange(started_, nullptr);
  if (!done) return {};
  return PendingCall([this, done, site = std::string(site)] {
    check(cudaStreamWaitEvent(compute_, done, 0), "cudaStreamWaitEvent", site);
  });
}

PendingCall NcclCommunicator::start_all_reduce(Tensor x, ReduceOp op, std::string_view site) {
  return started(site, [&] { all_reduce(x, op, site); });
}

PendingCall NcclCommunicator::start_reduce_scatter(Tensor out, Tensor in, std::string_view site) {
  return started(site, [&] { reduce_scatter(out, in, site); });
}

PendingCall NcclCommunicator::start_all_gather(Tensor out, Tensor in, std::string_view site) {
  return started(site, [&] { all_gather(out, in, site); });
}

void NcclCommunicator::all_reduce(Tensor x, ReduceOp op, std::string_view site) {
  if (!on_device(x))
    return on_host(*this, Collective::all_reduce, site, x.numel(), x.dtype,
                   [&] { bootstrap_->all_reduce(x, op, site); });
  check_usable(site);
  check_data(x, "all_reduce", site, name());
  if (size() == 1) return;
  const ncclRedOp_t nccl_op = op == ReduceOp::sum ? ncclSum : ncclMax;
  run("ncclAllReduce", Collective::all_reduce, site, x.numel(), x.dtype, [&] {
    return ncclAllReduce(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype), nccl_op,
                         comm_.get(), stream_.get());
  });
}

void NcclCommunicator::all_gather(Tensor out, Tensor in, std::string_view site) {
  BOTTLE_CHECK(on_device(out) == on_device(in),
               "all_gather at '{}' on the '{}' group: out is in {} memory, in is in {} memory",
               site, name(), device_name(out.device), device_name(in.device));
  if (!on_device(in))
    return on_host(*this, Collective::all_gather, site, out.numel(), out.dtype,
                   [&] { bootstrap_->all_gather(out, in, site); });
  check_usable(site);
  BOTTLE_CHECK(out.dtype == in.dtype, "all_gather at '{}' on the '{}' group: out is {}, in is {}",
               site, name(), dtype_name(out.dtype), dtype_name(in.dtype));
  BOTTLE_CHECK(out.numel() == int64_t(size()) * in.numel(),
               "all_gather at '{}' on the '{}' group: out has {} elements, expected size × in = "
               "{} × {} = {}",
               site, name(), out.numel(), size(), in.numel(), int64_t(size()) * in.numel());
  check_data(in, "all_gather", site, name());
  check_data(out, "all_gather", site, name());
  if (size() == 1) {
    // On the compute stream: nothing else is involved.
    if (out.data != in.data && in.nbytes())
      check(cudaMemcpyAsync(out.data, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, compute_),
            "cudaMemcpyAsync", site);
    return;
  }
  run("ncclAllGather", Collective::all_gather, site, out.numel(), out.dtype, [&] {
    return ncclAllGather(in.data, out.data, size_t(in.numel()), nccl_type(in.dtype), comm_.get(),
                         stream_.get());
  });
}

void NcclCommunicator::reduce_scatter(Tensor out, Tensor in, std::string_view site) {
  BOTTLE_CHECK(on_device(out) == on_device(in),
               "reduce_scatter at '{}' on the '{}' group: out is in {} memory, in is in {} memory",
               site, name(), device_name(out.device), device_name(in.device));
  if (!on_device(in))
    return on_host(*this, Collective::reduce_scatter, site, in.numel(), in.dtype,
                   [&] { bootstrap_->reduce_scatter(out, in, site); });
  check_usable(site);
  BOTTLE_CHECK(out.dtype == in.dtype,
               "reduce_scatter at '{}' on the '{}' group: out is {}, in is {}", site, name(),
               dtype_name(out.dtype), dtype_name(in.dtype));
  BOTTLE_CHECK(in.numel() % size() == 0,
               "reduce_scatter at '{}' on the '{}' group: in has {} elements, not a multiple of "
               "the group size {}",
               site, name(), in.numel(), size());
  BOTTLE_CHECK(out.numel() == in.numel() / size(),
               "reduce_scatter at '{}' on the '{}' group: out has {} elements, expected in / size "
               "= {} / {} = {}",
               site, name(), out.numel(), in.numel(), size(), in.numel() / size());
  check_data(in, "reduce_scatter", site, name());
  check_data(out, "reduce_scatter", site, name());
  if (size() == 1) {
    if (out.data != in.data && in.nbytes())
      check(cudaMemcpyAsync(out.data, in.data, in.nbytes(), cudaMemcpyDeviceToDevice, compute_),
            "cudaMemcpyAsync", site);
    return;
  }
  run("ncclReduceScatter", Collective::reduce_scatter, site, in.numel(), in.dtype, [&] {
    return ncclReduceScatter(in.data, out.data, size_t(out.numel()), nccl_type(in.dtype), ncclSum,
                             comm_.get(), stream_.get());
  });
}

void NcclCommunicator::broadcast(Tensor x, int root, std::string_view site) {
  if (!on_device(x))
    return on_host(*this, Collective::broadcast, site, x.numel(), x.dtype,
                   [&] { bootstrap_->broadcast(x, root, site); });
  check_usable(site);
  BOTTLE_CHECK(root >= 0 && root < size(),
               "broadcast at '{}' on the '{}' group: root {} is not a rank of a group of {}", site,
               name(), root, size());
  check_data(x, "broadcast", site, name());
  if (size() == 1) return;
  run("ncclBroadcast", Collective::broadcast, site, x.numel(), x.dtype, [&] {
    return ncclBroadcast(x.data, x.data, size_t(x.numel()), nccl_type(x.dtype), root, comm_.get(),
                         stream_.get());
  });
}

void NcclCommunicator::send(Tensor x, int dest, int tag, std::string_view site) {
  if (!on_device(x))
    return on_host(*this, Collective::send, site, x.numel(), x.dtype,
                   [&] { bootstrap_->send(x, dest, tag, site); });
  check_usable(site);
  BOTTLE_CHECK(dest >= 0 && dest < size() && tag >= 0,
               "send at '{}' on the '{}' group: destination {} with tag {} (ranks 0..{}, tags "
               "from 0)",
               site, name(), dest, tag, size() - 1);
  check_data(x, "send", site, name());
  if (size() == 1) return;
  BOTTLE_CHECK(dest != rank(), "send at '{}' on the '{}' group: rank {} sends to itself", site,
               name(), rank());
  run("ncclSend", Collective::send, site, x.numel(), x.dtype, [&] {
    return ncclSend(x.data, size_t(x.numel()), nccl_type(x.dtype), dest, comm_.get(),
                    stream_.get());
  });
}

void NcclCommunicator::recv(Tensor x, int source, int tag, std::string_view site) {
  if (!on_device(x))
    return on_host(*this, Collective::recv, site, x.numel(), x.dtype,
                   [&] { bootstrap_->recv(x, source, tag, site); });
  check_usable(site);
  BOTTLE_CHECK(source >= 0 && source < size() && tag >= 0,
               "recv at '{}' on the '{}' group: source {} with tag {} (ranks 0..{}, tags from 0)",
               site, name(), source, tag, size() - 1);
  check_data(x, "recv", site, name());
  if (size() == 1) return;
  BOTTLE_CHECK(source != rank(), "recv at '{}' on the '{}' group: rank {} receives from itself",
               site, name(), rank());
  run("ncclRecv", Collective::recv, site, x.numel(), x.dtype, [&] {
    return ncclRecv(x.data, size_t(x.numel()), nccl_type(x.dtype), source, comm_.get(),
                    stream_.get());
  });
}

void NcclCommunicator::send_async(Tensor x, int dest, int tag, std::string_view site) {
  if (!on_device(x))
    return on_host(*this, Collective::send, site, x.numel(), x.dtype,
                   [&] { bootstrap_->send_async(x, dest, tag, site); });
  check_usable(site);
  BOTTLE_CHECK(dest >= 0 && dest < size() && dest != rank() && tag >= 0,
               "send at '{}' on the '{}' group: rank {} to destination {} with tag {} (ranks "
               "0..{}, tags from 0)",
               site, name(), rank(), dest, tag, size() - 1);
  check_data(x, "send", site, name());
  // Host time to issue it: the send itself completes later, unobserved.
  const auto start = Clock::now();
  const size_t bytes = x.nbytes();
  // Senders of a schedule send the same sizes again and again, so the copies come back.
  auto reuse = std::find_if(free_buffers_.begin(), free_buffers_.end(),
                            [&](const SendBuffer& b) { return b.bytes >= bytes; });
  SendBuffer buffer;
  if (reuse != free_buffers_.end()) {
    buffer = *reuse;
    free_buffers_.erase(reuse);
  } else {
    buffer.bytes = std::max<size_t>(bytes, 1);
    // Stream-ordered, so it does not synchronise the device as cudaMalloc may.
    check(cudaMallocAsync(&buffer.data, buffer.bytes, stream_.get()), "cudaMallocAsync", site);
  }
  // Owned from here on, so that the destructor frees it whatever fails next.
  pending_sends_.push_back(buffer);
  after_compute(site);
  if (bytes)
    check(cudaMemcpyAsync(buffer.data, x.data, bytes, cudaMemcpyDeviceToDevice, stream_.get()),
          "cudaMemcpyAsync", site);
  // The caller may overwrite x at once: its next kernels wait for the copy, not the send.
  check(cudaEventRecord(ready_.get(), stream_.get()), "cudaEventRecord", site);
  check(cudaStreamWaitEvent(compute_, ready_.get(), 0), "cudaStreamWaitEvent", site);
  check(ncclSend(buffer.data, size_t(x.numel()), nccl_type(x.dtype), dest, comm_.get(),
                 stream_.get()),
        "ncclSend", site);
  stats_.record(Collective::send, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

void NcclCommunicator::wait_sends() {
  if (pending_sends_.empty()) {
    bootstrap_->wait_sends();
    return;
  }
  check_usable("wait_sends");
  // Not a call of its own: the sends were counted when they were issued.
  complete();
  check(cudaEventRecord(stop_.get(), stream_.get()), "cudaEventRecord", "wait_sends");
  wait(stop_.get(), "ncclSend", "wait_sends");
  free_buffers_.insert(free_buffers_.end(), pending_sends_.begin(), pending_sends_.end());
  pending_sends_.clear();
  bootstrap_->wait_sends();
}

void NcclCommunicator::barrier() {
  check_usable("barrier");
  const auto start = Clock::now();
  // Everything this rank queued has completed when its peers are told it arrived.
  complete();
  check(cudaEventRecord(stop_.get(), stream_.get()), "cudaEventRecord", "barrier");
  wait(stop_.get(), "cudaEventQuery", "barrier");
  bootstrap_->barrier();
  if (size() > 1) stats_.record(Collective::barrier, "barrier", 0, 0, seconds_since(start));
}

std::unique_ptr<Communicator> NcclCommunicator::split(int color, int key, std::string name) {
  return std::make_unique<NcclCommunicator>(bootstrap_->split(color, key, std::move(name)),
                                            backend_);
}

}  // namespace bottle
