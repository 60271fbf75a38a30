#include "apps/version.h"

#include <fmt/format.h>

#include "bottle_build_info.h"
#include "comm/communicator.h"
#include "backend/backend.h"
#include "sys/system_info.h"

namespace bottle {

std::string version_text() {
  std::string text = fmt::format("bottle {} (commit {}, {} build, GCC {}.{}.{}, C++{})\n",
                                 BOTTLE_VERSION, BOTTLE_GIT_COMMIT, BOTTLE_BUILD_TYPE, __GNUC__,
                                 __GNUC_MINOR__, __GNUC_PATCHLEVEL__, __cplusplus / 100 % 100);
  text += fmt::format("compiled for: {}{}\n", compiled_isa(),
                      BOTTLE_NATIVE_BUILD ? " (-march=native: runs on CPUs like the building one)"
                                          : " (portable: BOTTLE_NATIVE=OFF)");
  for (const std::string& b : backend_names()) text += "backend " + b + "\n";
  for (const std::string& c : comm_backends()) text += "communicator " + c + "\n";
  text += fmt::format("this CPU: {}", cpu_summary());
  return text;
}

}  // namespace bottle
