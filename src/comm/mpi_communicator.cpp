#include "comm/mpi_communicator.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <thread>

#include "core/bf16.h"

namespace bottle {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// Element types for moving data; bf16 travels as 16-bit patterns and is reduced by
// bf16_sum / bf16_max (MPI has no bf16 arithmetic).
MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::f32:
      return MPI_FLOAT;
    case DType::i32:
      return MPI_INT32_T;
    case DType::bf16:
      return MPI_UINT16_T;
    case DType::f64:
      return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

bool reducible(DType t) {
  return t == DType::f32 || t == DType::i32 || t == DType::bf16 || t == DType::f64;
}

// bf16 partials meet in fp32 and the result is rounded to nearest even: a + b == b + a,
// so every rank of the recursive doubling still ends with the same bits.
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = bf16_from_float(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}
void bf16_max(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const uint16_t*>(in);
  auto* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i)
    if (bf16_to_float(a[i]) > bf16_to_float(b[i])) b[i] = a[i];
}

MPI_Op mpi_reduce_op(ReduceOp op, DType t) {
  if (t != DType::bf16) return op == ReduceOp::sum ? MPI_SUM : MPI_MAX;
  // Created once, after MPI_Init (the first bf16 reduction), and never freed: MPI_Finalize
  // releases them.
  static const std::pair<MPI_Op, MPI_Op> ops = [] {
    MPI_Op sum = MPI_OP_NULL, max = MPI_OP_NULL;
    MPI_Op_create(&bf16_sum, 1, &sum);
    MPI_Op_create(&bf16_max, 1, &max);
    return std::pair{sum, max};
  }();
  return op == ReduceOp::sum ? ops.first : ops.second;
}

// Each world rank's host name (MPI_Get_processor_name), in world-rank order: gathered once,
// when the world's communicator is made, so that a call that times out can name the host of
// the rank it waited for without another collective (which could not complete then).
std::vector<std::string>& world_hosts() {
  static std::vector<std::string> hosts;
  return hosts;
}

void gather_world_hosts(MPI_Comm world, int size) {
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  if (MPI_Get_processor_name(name, &length) != MPI_SUCCESS) length = 0;
  std::vector<char> all(size_t(size) * MPI_MAX_PROCESSOR_NAME);  // [size][MPI_MAX_PROCESSOR_NAME]
  if (MPI_Allgather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(), MPI_MAX_PROCESSOR_NAME,
                    MPI_CHAR, world) != MPI_SUCCESS)
    return;  // the names are only for messages
  std::vector<std::string>& hosts = world_hosts();
  hosts.clear();
  for (int r = 0; r < size; ++r) {
    const char* begin = all.data() + size_t(r) * MPI_MAX_PROCESSOR_NAME;
    hosts.emplace_back(begin, strnlen(begin, MPI_MAX_PROCESSOR_NAME));
  }
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name, bool owned)
    : comm_(comm), name_(std::move(name)), owned_(owned) {
  // The default handler aborts with MPI's own message, which names neither the group nor
  // the call site; check() prints both.
  check(MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler", "create");
  check(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank", "create");
  check(MPI_Comm_size(comm_, &size_), "MPI_Comm_size", "create");
  // all_reduce's own messages take the largest tag, which send/recv refuse.
  void* tag_ub = nullptr;
  int found = 0;
  check(MPI_Comm_get_attr(comm_, MPI_TAG_UB, &tag_ub, &found), "MPI_Comm_get_attr", "create");
  reduce_tag_ = found ? *static_cast<int*>(tag_ub) : 32767;
  // The world ranks of this group's ranks, for the messages that name a peer.
  MPI_Group group = MPI_GROUP_NULL, world_group = MPI_GROUP_NULL;
  std::vector<int> ranks(static_cast<size_t>(size_));  // [size_] 0..size_-1
  for (int r = 0; r < size_; ++r) ranks[size_t(r)] = r;
  world_ranks_.assign(size_t(size_), -1);
  check(MPI_Comm_group(comm_, &group), "MPI_Comm_group", "create");
  check(MPI_Comm_group(MPI_COMM_WORLD, &world_group), "MPI_Comm_group", "create");
  check(MPI_Group_translate_ranks(group, size_, ranks.data(), world_group, world_ranks_.data()),
        "MPI_Group_translate_ranks", "create");
  MPI_Group_free(&group);
  MPI_Group_free(&world_group);
  if (comm_ == MPI_COMM_WORLD && size_ > 1) gather_world_hosts(comm_, size_);
  // Started calls run on a thread of their own only where MPI allows two threads in it at once.
  int level = MPI_THREAD_SINGLE;
  check(MPI_Query_thread(&level), "MPI_Query_thread", "create");
  threaded_ = level == MPI_THREAD_MULTIPLE;
}

MpiCommunicator::~MpiCommunicator() {
  // Started calls run to their end before the group goes (their errors have nobody to go to);
  // while an exception unwinds, their peers may never come, and they are abandoned instead.
  if (thread_ && std::uncaught_exceptions() > 0) abandon();
  if (thread_) try {
      thread_->drain();
    } catch (...) {
    }
  thread_.reset();
  // Sends still in flight: only an error path destroys a group before wait_sends (an
  // exception unwinding the pipeline). MPI goes on reading their buffers until the job's
  // end (MPI_Finalize completes them), so the buffers must outlive this object: they are
  // handed to a list that is never freed, and the requests released to complete on their own.
  if (!pending_sends_.empty()) {
    static std::vector<std::vector<char>>& in_flight =
        *std::make_unique<std::vector<std::vector<char>>>().release();
    for (MPI_Request& r : pending_sends_)
      if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    for (std::vector<char>& b : pending_buffers_) in_flight.push_back(std::move(b));
    pending_sends_.clear();
    pending_buffers_.clear();
  }
  if (!owned_ || comm_ == MPI_COMM_NULL) return;
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) check(MPI_Comm_free(&comm_), "MPI_Comm_free", "destroy");
}

void abort_job() {
  // MPI_Abort hands the request to this host's daemon and ends the process once the daemon
  // took it (measured on the emulated cluster: within half a second, even with a host of the
  // job stopped, mpirun's own included).
  // A daemon that never answers would keep this rank, its error printed, alive for good; the
  // watchdog below ends it instead. It is started first, as the abort may never return.
  try {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::seconds(kExitGraceSeconds));
      std::_Exit(1);
    }).detach();
  } catch (const std::exception&) {
    // No thread to be had (a process limit): the abort alone, as before.
  }
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

void MpiCommunicator::check(int rc, const char* function, std::string_view site) const {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  const std::string error = MPI_Error_string(rc, text, &length) == MPI_SUCCESS
                                ? std::string(text, size_t(length))
                                : fmt::format("error code {}", rc);
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  // One write, so that the lines of several failing ranks do not interleave.
  std::string line =
      fmt::format("bottle: error: rank {}: {} on the '{}' group (site '{}') failed: {}\n",
                  world_rank, function, name_, site, error);
  fmt::print(stderr, "{}", line);
  std::fflush(stderr);
  abort_job();
}

std::string MpiCommunicator::describe_rank(int rank) const {
  const int world = world_ranks_.at(size_t(rank));
  const std::vector<std::string>& hosts = world_hosts();
  const std::string host = world >= 0 && size_t(world) < hosts.size() ? hosts[size_t(world)] : "";
  return host.empty() ? fmt::format("rank {} (world rank {})", rank, world)
                      : fmt::format("rank {} (world rank {} on {})", rank, world, host);
}

void MpiCommunicator::fail_stalled(const char* function, std::string_view site, int peer) const {
  std::string whom;
  if (peer >= 0) {
    whom = "its " + describe_rank(peer);
  } else {
    // A collective cannot tell which rank is late: every other rank is named.
    for (int r = 0; r < size_; ++r)
      if (r != rank_) whom += (whom.empty() ? "its " : ", ") + describe_rank(r);
  }
  // One write, so that the lines of several ranks that time out together do not interleave.
  const std::string line = fmt::format(
      "bottle: error: {} of the '{}' group: {} at '{}' made no progress for {:g} s, waiting "
      "for {}: that rank stopped, died or lost its link (parallel.comm_timeout)\n",
      describe_rank(rank_), name_, function, site, std::chrono::duration<double>(timeout_).count(),
      whom);
  fmt::print(stderr, "{}", line);
  std::fflush(nullptr);
  abort_job();
}

namespace {

// Set on a group's CommThread: its calls run beside the caller's computation, which a
// spinning wait would take a core from. It polls every 100 us at most instead: Open MPI's TCP
// transport moves a large message only in a progress call, a few fragments each, and
// measured across emulated nodes at 3 Gbit/s (tools/cluster/bench_overlap.sh) pauses of 1 ms
// hid less of the gradient all-reduce (steps 1.58 and 1.65 x the step without DP
// communication, against 1.42 and 1.52 x at 100 us).
thread_local bool on_comm_thread = false;
constexpr int kCommThreadPauseUs = 100;
constexpr int kLongestPauseUs = 1000;

}  // namespace

void MpiCommunicator::wait(int count, MPI_Request* requests, MPI_Status* statuses,
                           const char* function, std::string_view site, int peer) const {
  // Spinning keeps collectives between ranks in step at their blocking speed: Open MPI's TCP
  // transport moves a message (and answers its peer's handshakes) only inside a poll, so every
  // pause stalls the transfer at both ends. Spinning for the first 20 ms covers a TP
  // all-reduce whole on the emulated clusters; at 1 ms, bench tp's TP collectives took 1.2 to
  // 1.3x as long (tools/cluster/MEASURED.txt, 2026-12-05). Each spin yields the core, so that
  // a rank sharing it with others that compute does not hold it from them. Past that, a pause
  // of an eighth of the time waited so far (at most a millisecond) adds at most ~1/8 to a long
  // wait while using almost no CPU: a stopped or far slower peer costs nothing. The
  // communication thread never spins, and pauses for at most 100 us.
  const auto kSpin =
      on_comm_thread ? Clock::duration::zero()
                     : std::chrono::duration_cast<Clock::duration>(std::chrono::milliseconds(20));
  const auto kLongestPause =
      std::chrono::microseconds(on_comm_thread ? kCommThreadPauseUs : kLongestPauseUs);
  const auto start = Clock::now();
  for (;;) {
    int done = 0;
    check(MPI_Testall(count, requests, &done, statuses), function, site);
    if (done) return;
    if (on_comm_thread && abandoned_.load(std::memory_order_relaxed))
      abandon_requests(count, requests, function, site);
    const auto waited = Clock::now() - start;
    if (waited < kSpin) {
      sched_yield();
      continue;
    }
    if (waited > timeout_) fail_stalled(function, site, peer);
    std::this_thread::sleep_for(std::min<Clock::duration>(
        waited / 8, std::chrono::duration_cast<Clock::duration>(kLongestPause)));
  }
}

void MpiCommunicator::abandon_requests(int count, MPI_Request* requests, const char* function,
                                       std::string_view site) const {
  // A receive not yet matched is cancelled; one under way, a send or a collective (which MPI
  // does not let one cancel) completes once its peer takes part, for which a second is
  // granted; past it the requests are left to MPI (freed when they complete), the job ending
  // meanwhile. `function` is the call that made them: "MPI_Irecv" (receives only), or the
  // recursive doubling's "MPI_Isend/MPI_Irecv" (its receive first).
  const std::string_view made_by(function);
  const int receives = made_by == "MPI_Irecv" ? count : made_by == "MPI_Isend/MPI_Irecv" ? 1 : 0;
  for (int i = 0; i < receives; ++i)
    if (requests[i] != MPI_REQUEST_NULL) MPI_Cancel(&requests[i]);
  const auto start = Clock::now();
  int done = 0;
  while (!done && Clock::now() - start < std::chrono::seconds(1)) {
    MPI_Testall(count, requests, &done, MPI_STATUSES_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  if (!done)
    for (int i = 0; i < count; ++i)
      if (requests[i] != MPI_REQUEST_NULL) MPI_Request_free(&requests[i]);
  fail("{} at '{}' on the '{}' group: abandoned (an error ends the job)", function, site, name_);
}

void MpiCommunicator::abandon() {
  abandoned_ = true;
  if (!thread_) return;
  try {
    thread_->drain();
  } catch (...) {
    // The abandoned calls' errors: the job's own error is the one to report.
  }
}

void MpiCommunicator::settle() {
  if (thread_ && thread_->busy()) thread_->drain();
}

void MpiCommunicator::complete() { settle(); }

void MpiCommunicator::record(Collective kind, std::string_view site, int64_t elements,
                             size_t element_bytes, double seconds) {
  std::lock_guard lock(stats_mutex_);
  stats_.record(kind, site, elements, element_bytes, seconds);
}

PendingCall MpiCommunicator::start(Collective kind, std::string_view site, int64_t elements,
                                   size_t element_bytes, std::function<void()> run) {
  if (!thread_) thread_ = std::make_unique<CommThread>();
  std::string recorded;
  {
    std::lock_guard lock(stats_mutex_);
    recorded = stats_.record_untimed(kind, site, elements, element_bytes);
  }
  const uint64_t ticket = thread_->post([this, kind, recorded, run = std::move(run)] {
    on_comm_thread = true;
    const auto start = Clock::now();
    run();
    const double seconds = seconds_since(start);
    std::lock_guard lock(stats_mutex_);
    stats_.add_seconds(kind, recorded, seconds);
  });
  return PendingCall(
      [this, kind, recorded = std::move(recorded), ticket] {
        const auto start = Clock::now();
        thread_->wait(ticket);
        const double waited = seconds_since(start);
        std::lock_guard lock(stats_mutex_);
        stats_.add_exposed(kind, recorded, waited);
      },
      [this] { abandon(); });
}

namespace {

int checked_count(const Tensor& t, const char* what, std::string_view site,
                  const std::string& group) {
  BOTTLE_CHECK(t.numel() <= INT_MAX, "{} at '{}' on the '{}' group: {} elements exceed {}", what,
               site, group, t.numel(), INT_MAX);
  BOTTLE_CHECK(t.numel() == 0 || t.data != nullptr,
               "{} at '{}' on the '{}' group: tensor of shape {} has no data", what, site, group,
               t.shape.str());
  return int(t.numel());
}

}  // namespace

int MpiCommunicator::check_all_reduce(const Tensor& x, std::string_view site) const {
  BOTTLE_CHECK(reducible(x.dtype),
               "all_reduce at '{}' on the '{}' group: dtype {} (f32, bf16 or i32)", site, name_,
               dtype_name(x.dtype));
  return checked_count(x, "all_reduce", site, name_);
}

void MpiCommunicator::all_reduce(Tensor x, ReduceOp op, std::string_view site) {
  const int count = check_all_reduce(x, site);
  if (size_ == 1) return;
  settle();
  const auto start = Clock::now();
  run_all_reduce(x, count, op, site);
  record(Collective::all_reduce, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

PendingCall MpiCommunicator::start_all_reduce(Tensor x, ReduceOp op, std::string_view site) {
  const int count = check_all_reduce(x, site);
  if (size_ == 1 || !threaded_) {
    all_reduce(x, op, site);
    return {};
  }
  return start(
      Collective::all_reduce, site, x.numel(), dtype_size(x.dtype),
      [this, x, count, op, site = std::string(site)] { run_all_reduce(x, count, op, site); });
}

void MpiCommunicator::run_all_reduce(Tensor x, int count, ReduceOp op, std::string_view site) {
  const MPI_Op mpi_op = mpi_reduce_op(op, x.dtype);
  if ((size_ & (size_ - 1)) == 0) {
    // Recursive doubling over point-to-point messages, each waited for by wait(): as fast as
    // Open MPI's blocking all-reduce, which busy-polls, and its non-blocking one (libnbc) is
    // 2-10x slower. In round k a rank adds its partner's (rank ^ 2^k) partial sum; a + b ==
    // b + a exactly, so every rank ends with bitwise the same result, and each element meets
    // the same partial sums in the same rounds however the message is cut.
    // In chunks, so that the partner's copy stays small beside a whole model's gradients, with
    // up to kWindow chunks' exchanges in flight: above Open MPI's TCP eager limit every message
    // pays a rendezvous (request, clear to send, data), which one chunk at a time would pay in
    // full per chunk. Measured on two emulated nodes (1.5 Gbit/s, 1.4 ms one way,
    // tools/cluster/MEASURED.txt 2026-12-05): 32 MiB in 337-340 ms one chunk at a time,
    // 226-238 with 8 in flight, 212 with 16, 203 with 32; the link alone takes 179.
    constexpr int kChunk = 1 << 18;  // elements
    constexpr int kWindow = 16;      // chunks in flight
    const size_t element = dtype_size(x.dtype);
    const int chunks = int((int64_t(count) + kChunk - 1) / kChunk);
    // Slot s holds the partner's copy of chunk c for c % kWindow == s.
    reduce_scratch_.resize(size_t(std::min<int64_t>(count, int64_t(kWindow) * kChunk)) *
                           element);  // [min(count, kWindow · kChunk)] elements
    auto chunk_size = [&](int c) {
      return int(std::min<int64_t>(kChunk, count - int64_t(c) * kChunk));
    };
    auto chunk_data = [&](int c) {
      return static_cast<char*>(x.data) + size_t(c) * kChunk * element;
    };
    auto slot_data = [&](int c) {
      return reduce_scratch_.data() + size_t(c % kWindow) * kChunk * element;
    };
    std::array<MPI_Request, 2 * kWindow> requests;  // [slot][receive, send]
    requests.fill(MPI_REQUEST_NULL);
    for (int distance = 1; distance < size_; distance *= 2) {
      const int partner = rank_ ^ distance;
      int posted = 0;
      for (int done = 0; done < chunks; ++done) {
        for (; posted < chunks && posted - done < kWindow; ++posted) {
          MPI_Request* pair = &requests[size_t(2 * (posted % kWindow))];
          check(MPI_Irecv(slot_data(posted), chunk_size(posted), mpi_type(x.dtype), partner,
                          reduce_tag_, comm_, &pair[0]),
                "MPI_Irecv", site);
          check(MPI_Isend(chunk_data(posted), chunk_size(posted), mpi_type(x.dtype), partner,
                          reduce_tag_, comm_, &pair[1]),
                "MPI_Isend", site);
        }
        MPI_Request* pair = &requests[size_t(2 * (done % kWindow))];
        try {
          wait(2, pair, MPI_STATUSES_IGNORE, "MPI_Isend/MPI_Irecv", site, partner);
        } catch (...) {
          // The job ends: the later chunks' receives are cancelled and every request left to
          // MPI, as wait() leaves the pair it gave up on.
          for (size_t i = 0; i < requests.size(); ++i) {
            if (requests[i] == MPI_REQUEST_NULL) continue;
            if (i % 2 == 0) MPI_Cancel(&requests[i]);
            MPI_Request_free(&requests[i]);
          }
          throw;
        }
        check(MPI_Reduce_local(slot_data(done), chunk_data(done), chunk_size(done),
                               mpi_type(x.dtype), mpi_op),
              "MPI_Reduce_local", site);
      }
    }
  } else {
    MPI_Request request;
    check(MPI_Iallreduce(MPI_IN_PLACE, x.data, count, mpi_type(x.dtype), mpi_op, comm_, &request),
          "MPI_Iallreduce", site);
    wait(1, &request, MPI_STATUS_IGNORE, "MPI_Iallreduce", site);
  }
}

int MpiCommunicator::check_all_gather(const Tensor& out, const Tensor& in,
                                      std::string_view site) const {
  BOTTLE_CHECK(out.dtype == in.dtype, "all_gather at '{}' on the '{}' group: out is {}, in is {}",
               site, name_, dtype_name(out.dtype), dtype_name(in.dtype));
  BOTTLE_CHECK(out.numel() == int64_t(size_) * in.numel(),
               "all_gather at '{}' on the '{}' group: out has {} elements, expected size × in = "
               "{} × {} = {}",
               site, name_, out.numel(), size_, in.numel(), int64_t(size_) * in.numel());
  checked_count(out, "all_gather", site, name_);
  return checked_count(in, "all_gather", site, name_);
}

void MpiCommunicator::all_gather(Tensor out, Tensor in, std::string_view site) {
  const int count = check_all_gather(out, in, site);
  if (size_ == 1) {
    if (out.data != in.data && in.nbytes()) std::memmove(out.data, in.data, in.nbytes());
    return;
  }
  settle();
  const auto start = Clock::now();
  run_all_gather(out, in, count, site);
  record(Collective::all_gather, site, out.numel(), dtype_size(out.dtype), seconds_since(start));
}

PendingCall MpiCommunicator::start_all_gather(Tensor out, Tensor in, std::string_view site) {
  const int count = check_all_gather(out, in, site);
  if (size_ == 1 || !threaded_) {
    all_gather(out, in, site);
    return {};
  }
  return start(
      Collective::all_gather, site, out.numel(), dtype_size(out.dtype),
      [this, out, in, count, site = std::string(site)] { run_all_gather(out, in, count, site); });
}

void MpiCommunicator::run_all_gather(Tensor out, Tensor in, int count, std::string_view site) {
  const MPI_Datatype type = mpi_type(in.dtype);
  MPI_Request request;
  check(MPI_Iallgather(in.data, count, type, out.data, count, type, comm_, &request),
        "MPI_Iallgather", site);
  wait(1, &request, MPI_STATUS_IGNORE, "MPI_Iallgather", site);
}

int MpiCommunicator::check_reduce_scatter(const Tensor& out, const Tensor& in,
                                          std::string_view site) const {
  BOTTLE_CHECK(reducible(in.dtype) && out.dtype == in.dtype,
               "reduce_scatter at '{}' on the '{}' group: out is {}, in is {} (both f32 or i32)",
               site, name_, dtype_name(out.dtype), dtype_name(in.dtype));
  BOTTLE_CHECK(in.numel() % size_ == 0,
               "reduce_scatter at '{}' on the '{}' group: in has {} elements, not a multiple of "
               "the group size {}",
               site, name_, in.numel(), size_);
  BOTTLE_CHECK(out.numel() == in.numel() / size_,
               "reduce_scatter at '{}' on the '{}' group: out has {} elements, expected in / size "
               "= {} / {} = {}",
               site, name_, out.numel(), in.numel(), size_, in.numel() / size_);
  checked_count(in, "reduce_scatter", site, name_);
  return checked_count(out, "reduce_scatter", site, name_);
}

void MpiCommunicator::reduce_scatter(Tensor out, Tensor in, std::string_view site) {
  const int count = check_reduce_scatter(out, in, site);
  if (size_ == 1) {
    if (out.data != in.data && in.nbytes()) std::memmove(out.data, in.data, in.nbytes());
    return;
  }
  settle();
  const auto start = Clock::now();
  run_reduce_scatter(out, in, count, site);
  record(Collective::reduce_scatter, site, in.numel(), dtype_size(in.dtype), seconds_since(start));
}

PendingCall MpiCommunicator::start_reduce_scatter(Tensor out, Tensor in, std::string_view site) {
  const int count = check_reduce_scatter(out, in, site);
  if (size_ == 1 || !threaded_) {
    reduce_scatter(out, in, site);
    return {};
  }
  return start(Collective::reduce_scatter, site, in.numel(), dtype_size(in.dtype),
               [this, out, in, count, site = std::string(site)] {
                 run_reduce_scatter(out, in, count, site);
               });
}

void MpiCommunicator::run_reduce_scatter(Tensor out, Tensor in, int count, std::string_view site) {
  MPI_Request request;
  check(MPI_Ireduce_scatter_block(in.data, out.data, count, mpi_type(in.dtype),
                                  mpi_reduce_op(ReduceOp::sum, in.dtype), comm_, &request),
        "MPI_Ireduce_scatter_block", site);
  wait(1, &request, MPI_STATUS_IGNORE, "MPI_Ireduce_scatter_block", site);
}

void MpiCommunicator::broadcast(Tensor x, int root, std::string_view site) {
  BOTTLE_CHECK(root >= 0 && root < size_,
               "broadcast at '{}' on the '{}' group: root {} is not a rank of a group of {}", site,
               name_, root, size_);
  const int count = checked_count(x, "broadcast", site, name_);
  if (size_ == 1) return;
  settle();
  const auto start = Clock::now();
  MPI_Request request;
  check(MPI_Ibcast(x.data, count, mpi_type(x.dtype), root, comm_, &request), "MPI_Ibcast", site);
  wait(1, &request, MPI_STATUS_IGNORE, "MPI_Ibcast", site);
  record(Collective::broadcast, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

void MpiCommunicator::send(Tensor x, int dest, int tag, std::string_view site) {
  BOTTLE_CHECK(dest >= 0 && dest < size_ && tag >= 0 && tag < reduce_tag_,
               "send at '{}' on the '{}' group: destination {} with tag {} (ranks 0..{}, tags "
               "0..{})",
               site, name_, dest, tag, size_ - 1, reduce_tag_ - 1);
  const int count = checked_count(x, "send", site, name_);
  if (size_ == 1) return;
  // A blocking send to oneself never completes.
  BOTTLE_CHECK(dest != rank_, "send at '{}' on the '{}' group: rank {} sends to itself", site,
               name_, rank_);
  const auto start = Clock::now();
  MPI_Request request;
  check(MPI_Isend(x.data, count, mpi_type(x.dtype), dest, tag, comm_, &request), "MPI_Isend", site);
  wait(1, &request, MPI_STATUS_IGNORE, "MPI_Isend", site, dest);
  record(Collective::send, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

int MpiCommunicator::check_recv(const Tensor& x, int source, int tag, std::string_view site) const {
  BOTTLE_CHECK(source >= 0 && source < size_ && tag >= 0 && tag < reduce_tag_,
               "recv at '{}' on the '{}' group: source {} with tag {} (ranks 0..{}, tags from 0)",
               site, name_, source, tag, size_ - 1);
  const int count = checked_count(x, "recv", site, name_);
  BOTTLE_CHECK(size_ == 1 || source != rank_,
               "recv at '{}' on the '{}' group: rank {} receives from itself", site, name_, rank_);
  return count;
}

void MpiCommunicator::recv(Tensor x, int source, int tag, std::string_view site) {
  const int count = check_recv(x, source, tag, site);
  if (size_ == 1) return;
  const auto start = Clock::now();
  run_recv(x, count, source, tag, site);
  record(Collective::recv, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

PendingCall MpiCommunicator::start_recv(Tensor x, int source, int tag, std::string_view site) {
  const int count = check_recv(x, source, tag, site);
  if (size_ == 1) return {};
  // Without a thread of its own the receive waits for wait() (Communicator's rule).
  if (!threaded_) return Communicator::start_recv(x, source, tag, site);
  return start(Collective::recv, site, x.numel(), dtype_size(x.dtype),
               [this, x, count, source, tag, site = std::string(site)] {
                 run_recv(x, count, source, tag, site);
               });
}

void MpiCommunicator::run_recv(Tensor x, int count, int source, int tag, std::string_view site) {
  MPI_Status status;
  MPI_Request request;
  check(MPI_Irecv(x.data, count, mpi_type(x.dtype), source, tag, comm_, &request), "MPI_Irecv",
        site);
  wait(1, &request, &status, "MPI_Irecv", site, source);
  // A shorter message than expected would leave stale data in x without any error.
  int received = 0;
  check(MPI_Get_count(&status, mpi_type(x.dtype), &received), "MPI_Get_count", site);
  BOTTLE_CHECK(received == count,
               "recv at '{}' on the '{}' group: got {} elements from rank {}, expected {}", site,
               name_, received, source, count);
}

void MpiCommunicator::send_async(Tensor x, int dest, int tag, std::string_view site) {
  BOTTLE_CHECK(dest >= 0 && dest < size_ && dest != rank_ && tag >= 0 && tag < reduce_tag_,
               "send at '{}' on the '{}' group: rank {} to destination {} with tag {} (ranks "
               "0..{}, tags from 0)",
               site, name_, rank_, dest, tag, size_ - 1);
  const int count = checked_count(x, "send", site, name_);
  const auto start = Clock::now();
  const char* bytes = static_cast<const char*>(x.data);
  pending_buffers_.emplace_back(bytes, bytes + x.nbytes());
  MPI_Request request;
  check(MPI_Isend(pending_buffers_.back().data(), count, mpi_type(x.dtype), dest, tag, comm_,
                  &request),
        "MPI_Isend", site);
  pending_sends_.push_back(request);
  record(Collective::send, site, x.numel(), dtype_size(x.dtype), seconds_since(start));
}

void MpiCommunicator::wait_sends() {
  if (pending_sends_.empty()) return;
  // Not a call of its own: the sends were counted when they were issued.
  wait(int(pending_sends_.size()), pending_sends_.data(), MPI_STATUSES_IGNORE, "MPI_Isend",
       "wait_sends");
  pending_sends_.clear();
  pending_buffers_.clear();
}

void MpiCommunicator::barrier() {
  if (size_ == 1) return;
  settle();
  const auto start = Clock::now();
  MPI_Request request;
  check(MPI_Ibarrier(comm_, &request), "MPI_Ibarrier", "barrier");
  wait(1, &request, MPI_STATUS_IGNORE, "MPI_Ibarrier", "barrier");
  record(Collective::barrier, "barrier", 0, 0, seconds_since(start));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key, std::string name) {
  // MPI_UNDEFINED (negative) would leave this rank without a group.
  BOTTLE_CHECK(color >= 0, "split of the '{}' group into '{}': color {} is negative", name_, name,
               color);
  settle();
  MPI_Comm comm = MPI_COMM_NULL;
  check(MPI_Comm_split(comm_, color, key, &comm), "MPI_Comm_split", name);
  auto group = std::make_unique<MpiCommunicator>(comm, std::move(name), true);
  group->set_timeout(timeout_);
  return group;
}

}  // namespace bottle
