#pragma once
// main() of the test programs that run on a backend named on their command line
// (test_device_ops, test_model_backends): `PROGRAM [BACKEND] [gtest flags]`. A backend that
// cannot run on this machine (no GPU, a build without CUDA) is a skip, not a pass: the reason
// is printed and the exit status is 77, which ctest (SKIP_RETURN_CODE) reports as skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "core/backend.h"

namespace bottle::testing {

inline int run_on_backend(int argc, char** argv, std::string& backend) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) backend = argv[1];
  if (std::string why = backend_unavailable(backend); !why.empty()) {
    std::printf("SKIPPED: backend '%s': %s\n", backend.c_str(), why.c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}

}  // namespace bottle::testing
