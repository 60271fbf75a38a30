#pragma once
// bottle's GPU modules: the cuda backend (libbottle_cuda.so) and the NCCL communicator
// (libbottle_nccl.so) are shared libraries of their own, the only parts of bottle that link the
// CUDA runtime, cuBLASLt and NCCL. The bottle binary links none of them, so that it starts on
// any machine (one without CUDA, or under a small `ulimit -v`: cuBLASLt alone maps over half a
// gigabyte), and the registries open a module only when a run asks for what it holds.
//
// A module links none of bottle's static libraries: every bottle symbol it uses (Backend,
// Arena, Communicator, fail's Error, ...) is bound when it is opened to the executable's own
// copy, which the executable exports (cmake/gpu_module_exports.list), so that there is one
// copy of every global whichever side uses it. Its entry point returns a table of functions
// whose first field is the module's interface fingerprint (a hash of the headers both sides
// compile against, generated/gpu_module_abi.h); a module built from other sources than the
// executable is refused, naming both, instead of being called through a stale layout.
//
// Where a module is looked for: the folder BOTTLE_MODULE_DIR names when it is set (and only
// there, so that a test or a user can point elsewhere or nowhere), else beside the running
// executable (/proc/self/exe: the bottle binary, or a GPU bundle's bin/), then the build
// folder it was built in (for the test programs under build/tests/).
#include <string>
#include <string_view>

namespace bottle {

// A module's extern "C" entry point: its table of functions, whose first field is the
// interface fingerprint it was built with (a const char*).
using GpuModuleEntry = const void* (*)();

// An opened module, or why it could not be opened.
struct GpuModule {
  const void* api = nullptr;  // the entry point's table; null when `why` says why not
  std::string path;           // the file opened, for `bottle --version` (or the last looked at)
  std::string why;            // e.g. "cannot load /x/libbottle_cuda.so: libcublasLt.so.13: ..."
};

// Opens `file` (e.g. "libbottle_cuda.so") once per process, thread-safe, and calls its
// extern "C" `entry`; the result is kept for the process (a module is never closed: CUDA's
// libraries are not made to be unloaded). Never throws: a failure is a GpuModule with `why`.
const GpuModule& open_gpu_module(std::string_view file, const char* entry);

}  // namespace bottle
