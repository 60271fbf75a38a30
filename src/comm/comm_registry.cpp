// The one place that chooses the comm backend. Only Open MPI exists so far; a NCCL backend
// would be chosen here too, so nothing above comm/ names a backend.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "comm/communicator.h"
#include "comm/mpi_communicator.h"

namespace bottle {

namespace {

// Owns the MPI runtime of the process: started on first use, finalised when static
// objects are destroyed at exit, after every communicator built from the world (those are
// created later, so they are destroyed first).
class MpiRuntime {
 public:
  MpiRuntime() {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      // FUNNELED: only the main thread communicates (OpenMP workers never do). The fatal
      // error watchdog's MPI_Abort is the one exception; Open MPI's abort does not rely on
      // the thread level.
      int provided = 0;
      if (MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        std::fputs("bottle: error: MPI_Init_thread failed\n", stderr);
        std::fflush(stderr);
        std::_Exit(1);
      }
      owns_runtime_ = true;
    }
    world_ = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, "world", false);
  }

  ~MpiRuntime() {
    world_.reset();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owns_runtime_ && !finalized) MPI_Finalize();
  }

  MpiRuntime(const MpiRuntime&) = delete;
  MpiRuntime& operator=(const MpiRuntime&) = delete;

  Communicator& world() { return *world_; }

 private:
  bool owns_runtime_ = false;
  std::unique_ptr<MpiCommunicator> world_;
};

// Long enough for every rank of a job that failed everywhere (a config error) to finish
// MPI_Finalize; short enough that a job where some ranks wait in a collective ends soon.
constexpr auto kAbortDelay = std::chrono::seconds(3);

}  // namespace

Communicator& world_communicator() {
  static MpiRuntime runtime;
  return runtime.world();
}

std::vector<std::string> comm_backends() {
  char version[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int length = 0;
  MPI_Get_library_version(version, &length);
  std::string mpi(version, size_t(std::max(length, 0)));
  // Open MPI's string goes on with its repository and release date after the first comma.
  mpi = mpi.substr(0, mpi.find_first_of(",\n"));
  return {"mpi: " + mpi};
}

void report_fatal_error(const char* kind, const char* message) {
  // Asks MPI directly rather than world_communicator(): an error found before the runtime
  // started must not start it just to be reported.
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  int rank = 0, size = 1;
  if (initialized && !finalized) {
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  const std::string line = size > 1 ? fmt::format("bottle: {}: rank {}: {}\n", kind, rank, message)
                                    : fmt::format("bottle: {}: {}\n", kind, message);
  std::fputs(line.c_str(), stderr);
  // _Exit below skips stdio's flush at exit; what was printed before the error matters.
  std::fflush(nullptr);
  if (size == 1) return;

  // When every rank fails alike, MPI_Finalize completes on all of them and each exits
  // non-zero. When only some fail, the others wait in a collective, the finalize of the
  // failed ranks cannot complete, and the watchdog aborts the whole job instead.
  std::thread([] {
    std::this_thread::sleep_for(kAbortDelay);
    MPI_Abort(MPI_COMM_WORLD, 1);
    std::_Exit(1);
  }).detach();
  MPI_Finalize();
  std::_Exit(1);
}

}  // namespace bottle
