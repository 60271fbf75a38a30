#pragma once
// The rank layout of docs/design.md §8: world = tp × pp × dp, TP fastest-varying (TP inside a
// node), then DP, then PP:  world_rank = tp_rank + tp · (dp_rank + dp · pp_rank).
#include <memory>

#include "comm/communicator.h"

namespace bottle {

struct ParallelLayout {
  int tp = 1, pp = 1, dp = 1;
  int world_size() const { return tp * pp * dp; }
};

struct ProcessGroups {
  ParallelLayout layout;
  int world_rank = 0;
  int tp_rank = 0, dp_rank = 0, pp_rank = 0;
  Communicator* world = nullptr;
  std::unique_ptr<Communicator> tp, dp, pp;

  // Splits `world` into the three groups. Fails (same message on every rank, before any
  // collective) when world.size() != tp·pp·dp, naming both numbers. tp, dp and pp move
  // device tensors as `transport` says (make_group_communicator); the world stays on the
  // host communicator.
  static ProcessGroups create(Communicator& world, ParallelLayout layout,
                              const GroupTransport& transport = {});
};

}  // namespace bottle
