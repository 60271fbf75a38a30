// The entry point of libbottle_nccl.so (nccl_module.h): the table comm_registry.cpp calls.
#include "comm/nccl_module.h"

#include <fmt/format.h>

#include "comm/nccl_communicator.h"
#include "gpu_module_abi.h"

namespace bottle::nccl {

namespace {

std::string version() {
  int code = 0;
  if (ncclGetVersion(&code) != ncclSuccess) return "NCCL (version unknown)";
  // NCCL_VERSION_CODE: major·1000 + minor·100 + patch up to 2.8, major·10000 + ... since.
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? code % 10000 / 100 : code % 1000 / 100;
  return fmt::format("NCCL {}.{}.{}", major, minor, code % 100);
}

std::unique_ptr<Communicator> make_communicator(std::unique_ptr<Communicator> host_group,
                                                Backend& backend) {
  return std::make_unique<NcclCommunicator>(std::move(host_group), backend);
}

const ModuleApi kApi{BOTTLE_GPU_MODULE_ABI, &version, &make_communicator};

}  // namespace

}  // namespace bottle::nccl

extern "C" const void* bottle_nccl_module() { return &bottle::nccl::kApi; }
