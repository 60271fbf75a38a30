#include "comm/process_groups.h"

#include "core/setting_error.h"

namespace bottle {

ProcessGroups ProcessGroups::create(Communicator& world, ParallelLayout layout) {
  // Checked from values every rank has, so every rank fails alike before any collective.
  const std::string tp = mention(Setting::tp), pp = mention(Setting::pp), dp = mention(Setting::dp);
  if (layout.tp < 1 || layout.pp < 1 || layout.dp < 1)
    fail_setting(Setting::tp, "{}, {} and {} must be at least 1, not {}, {} and {}", tp, pp, dp,
                 layout.tp, layout.pp, layout.dp);
  // The job was launched with another number of ranks than the layout needs: the degrees are
  // what the message blames, the first of them standing for all three.
  if (world.size() != layout.world_size())
    fail_setting(Setting::tp, "world size {} does not equal {} × {} × {} = {} × {} × {} = {}",
                 world.size(), tp, pp, dp, layout.tp, layout.pp, layout.dp, layout.world_size());

  ProcessGroups g;
  g.layout = layout;
  g.world = &world;
  g.world_rank = world.rank();
  g.tp_rank = g.world_rank % layout.tp;
  g.dp_rank = g.world_rank / layout.tp % layout.dp;
  g.pp_rank = g.world_rank / (layout.tp * layout.dp);

  // Each group holds the ranks that agree on the two other coordinates, ordered by its own.
  g.tp = world.split(g.dp_rank + layout.dp * g.pp_rank, g.tp_rank, "tp");
  g.dp = world.split(g.tp_rank + layout.tp * g.pp_rank, g.dp_rank, "dp");
  g.pp = world.split(g.tp_rank + layout.tp * g.dp_rank, g.pp_rank, "pp");
  return g;
}

}  // namespace bottle
