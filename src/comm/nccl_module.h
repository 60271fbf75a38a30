#pragma once
// The NCCL module, libbottle_nccl.so: the NCCL communicator (nccl_communicator.h), the one part
// of bottle that links NCCL (backend/gpu_module.h says how it is found and opened).
// comm_registry.cpp reaches it only through this table, which the module's extern "C" entry
// point bottle_nccl_module() returns (nccl_module.cpp; a GpuModuleEntry, so it returns it as a
// const void*).
//
// Free of CUDA and NCCL headers: the registry includes it in every build that has NCCL.
#include <memory>
#include <string>

#include "backend/backend.h"
#include "comm/communicator.h"

namespace bottle::nccl {

inline constexpr const char* kModuleFile = "libbottle_nccl.so";
inline constexpr const char* kModuleEntry = "bottle_nccl_module";

struct ModuleApi {
  // First, so that the loader can read it before anything else: the interface fingerprint the
  // module was built with (generated/gpu_module_abi.h).
  const char* abi;
  // "NCCL 2.28.3": the library loaded, which may be newer than the headers built against.
  std::string (*version)();
  // A NcclCommunicator over `host_group`'s ranks, ordered against `backend`'s stream.
  std::unique_ptr<Communicator> (*make_communicator)(std::unique_ptr<Communicator> host_group,
                                                     Backend& backend);
};

}  // namespace bottle::nccl
