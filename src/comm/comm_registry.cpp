// The one place that chooses the comm backend: Open MPI for the world and host groups, Open
// MPI staged through the host or NCCL for groups that move device tensors, so that nothing
// above comm/ names a backend. NCCL is optional (BOTTLE_HAVE_NCCL); only this file asks, and
// opens the NCCL module (comm/nccl_module.h) when a run first needs it, so that bottle itself
// links no CUDA library.
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
#include "comm/staged_communicator.h"
#include "backend/backend.h"
#include "sys/launcher_guard.h"
#ifdef BOTTLE_HAVE_NCCL
#include "backend/gpu_module.h"
#include "comm/nccl_module.h"
#endif

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
      // MULTIPLE for a job of several processes: a group's started calls
      // (Communicator::start_*) run on its communication thread while the main thread calls
      // MPI on other groups (OpenMP workers never do). A single process communicates with
      // nobody and asks for FUNNELED, the level its exit has always run under. A library that
      // provides less runs started calls on the caller's thread (MpiCommunicator::threaded_).
      // The fatal error watchdog's MPI_Abort does not rely on the thread level.
      //
      // A process started without mpirun is an Open MPI singleton, and by default its
      // MPI_Init starts a helper daemon (orted) that calls setsid only once it runs. A Ctrl-C
      // or hang-up that reaches the process group in that window kills the daemon, and
      // MPI_Init then aborts the run ("Unable to start a daemon"). bottle never spawns
      // processes, so the singleton needs no daemon: ask for none, unless the user's
      // environment already decided. Under mpirun this parameter is not read.
      ::setenv("OMPI_MCA_ess_singleton_isolated", "1", /*overwrite=*/0);
      // Before MPI starts, so that nothing of MPI is in the guard's copy of the process: a
      // rank that mpirun started on its own host leaves a guard that ends mpirun should the
      // rank end without finishing MPI and mpirun then wait for a host that never answers.
      start_launcher_guard();
      int provided = 0;
      const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE");  // set by mpirun
      const int level = ranks && std::atoi(ranks) > 1 ? MPI_THREAD_MULTIPLE : MPI_THREAD_FUNNELED;
      if (MPI_Init_thread(nullptr, nullptr, level, &provided) != MPI_SUCCESS) {
        fmt::print(stderr, "bottle: error: MPI_Init_thread failed\n");
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
    // A rank that finished MPI ends as the job meant: mpirun ends the job on its own, and the
    // launcher guard has nothing to watch.
    if (owns_runtime_ && !finalized && MPI_Finalize() == MPI_SUCCESS) stand_down_launcher_guard();
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

#ifdef BOTTLE_HAVE_NCCL
// The NCCL module's table, or null with `why` saying what could not be loaded and what to do.
// `path` (if given) is set to the module's file.
const nccl::ModuleApi* nccl_module(std::string* why, std::string* path = nullptr) {
  const GpuModule& module = open_gpu_module(nccl::kModuleFile, nccl::kModuleEntry);
  if (path) *path = module.path;
  if (!module.api)
    *why = fmt::format(
        "this build's NCCL module could not be loaded ({}); NCCL needs {} beside the bottle "
        "binary and the CUDA 13 runtime and NCCL (libcudart.so.13, libnccl.so.2: install them or "
        "add their folder to LD_LIBRARY_PATH)",
        module.why, nccl::kModuleFile);
  return static_cast<const nccl::ModuleApi*>(module.api);
}
#endif

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
  std::vector<std::string> lines{"mpi: " + mpi};
#ifdef BOTTLE_HAVE_NCCL
  std::string why, path;
  if (const nccl::ModuleApi* module = nccl_module(&why, &path)) {
    lines.push_back("nccl: " + module->version());
    lines.push_back("nccl module: " + path);
  } else {
    lines.push_back("nccl: " + why);
  }
#endif
  return lines;
}

std::unique_ptr<Communicator> make_group_communicator(std::unique_ptr<Communicator> host_group,
                                                      const GroupTransport& transport) {
  BOTTLE_CHECK(host_group != nullptr, "make_group_communicator: no host group");
  const std::string& comm = transport.comm;
  Backend* backend = transport.backend;
  const bool device = backend && backend->device() != Device::cpu;
  if (comm == "mpi") {
    if (!device) return host_group;
    return std::make_unique<StagedCommunicator>(std::move(host_group), *backend);
  }
  if (comm == "nccl") {
    if (!device)
      fail(
          "parallel.comm = \"nccl\" needs a GPU backend (training.backend = \"cuda\"), not "
          "\"{}\"",
          backend ? backend->name() : std::string_view("cpu"));
#ifdef BOTTLE_HAVE_NCCL
    std::string why;
    if (const nccl::ModuleApi* module = nccl_module(&why))
      return module->make_communicator(std::move(host_group), *backend);
    fail("parallel.comm = \"nccl\": {} (or use parallel.comm = \"mpi\")", why);
#else
    fail(
        "parallel.comm = \"nccl\": this build has no NCCL (build with BOTTLE_CUDA=ON where the "
        "CUDA toolkit and NCCL are installed, or use parallel.comm = \"mpi\")");
#endif
  }
  fail(
      "parallel.comm = \"{}\": unknown; the choices are \"mpi\" (through the host) and "
      "\"nccl\" (GPU to GPU)",
      comm);
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
  fmt::print(stderr, "{}", line);
  // _Exit below skips stdio's flush at exit; what was printed before the error matters.
  std::fflush(nullptr);
  if (size == 1) return;

  // When every rank fails alike, MPI_Finalize completes on all of them and each exits
  // non-zero. When only some fail, the others wait in a collective, the finalize of the
  // failed ranks cannot complete, and the watchdog aborts the whole job instead.
  std::thread([] {
    std::this_thread::sleep_for(kAbortDelay);
    abort_job();
  }).detach();
  if (MPI_Finalize() == MPI_SUCCESS) stand_down_launcher_guard();
  std::_Exit(1);
}

}  // namespace bottle
