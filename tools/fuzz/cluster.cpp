// libFuzzer target: a cluster file of `bottle plan` through its parser, then priced (every
// collective, a GEMM and a kernel) so that any value the parser lets through is one the cost
// model can take. bottle::Error is the expected answer to bad input; anything else is a bug.
#include "plan/cluster.h"

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/error.h"
#include "plan/cost_model.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  bottle::ClusterSpec c;
  try {
    c = bottle::parse_cluster(text, "fuzz.toml");
  } catch (const bottle::Error&) {
    return 0;
  }
  double total = bottle::gemm_seconds(c, bottle::GemmShape{4096, 1024, 4096, 2, 2, 2, 4, true});
  total += bottle::kernel_seconds(c, "attention_forward", bottle::KernelCount{1, 1e12, 1e9}, true);
  for (auto kind : {bottle::Collective::all_reduce, bottle::Collective::all_gather,
                    bottle::Collective::reduce_scatter, bottle::Collective::broadcast,
                    bottle::Collective::send, bottle::Collective::barrier})
    total += bottle::collective_seconds(c, kind, 1 << 20, 8, bottle::nodes_spanned(c, 0, 8, 1));
  if (!(total >= 0)) std::abort();  // a negative or NaN time from values the parser accepted
  return 0;
}
