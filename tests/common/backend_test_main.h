#pragma once
// main() of the test programs that run on a backend named on their command line
// (test_device_ops, test_model_backends): `PROGRAM [BACKEND[:ATTENTION]] [gtest flags]`, where
// ATTENTION is training.attention's auto, cudnn or own ("cuda:own" runs the cuda backend with
// its own attention kernels, "cuda:cudnn" with cuDNN's or not at all). A backend that cannot
// run on this machine (no GPU, a build without CUDA) is a skip, not a pass: the reason is
// printed and the exit status is 77, which ctest (SKIP_RETURN_CODE) reports as skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "backend/backend.h"
#include "backend/backend_options.h"

namespace bottle::testing {

inline int run_on_backend(int argc, char** argv, std::string& backend,
                          BackendOptions* options = nullptr) {
  ::testing::InitGoogleTest(&argc, argv);
  if (argc > 1) backend = argv[1];
  if (const size_t colon = backend.find(':'); colon != std::string::npos) {
    const std::string attention = backend.substr(colon + 1);
    backend.resize(colon);
    bool known = false;
    for (AttentionChoice c : {AttentionChoice::automatic, AttentionChoice::cudnn, AttentionChoice::own})
      if (attention == attention_choice_name(c) && options) options->attention = c, known = true;
    if (!known) {
      std::fprintf(stderr, "unknown or unsupported attention '%s' (auto, cudnn or own)\n",
                   attention.c_str());
      return 2;
    }
  }
  if (std::string why = backend_unavailable(backend); !why.empty()) {
    std::printf("SKIPPED: backend '%s': %s\n", backend.c_str(), why.c_str());
    return 77;
  }
  return RUN_ALL_TESTS();
}

}  // namespace bottle::testing
