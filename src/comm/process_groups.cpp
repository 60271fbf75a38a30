#include "comm/process_groups.h"

#include "core/setting_error.h"

namespace bottle {

ProcessGroups ProcessGroups::create(Communicator& world, ParallelLayout layout,
                                    const GroupTransport& transport) {
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
  g.tp = make_group_communicator(world.split(g.dp_rank + layout.dp * g.pp_rank, g.tp_rank, "tp"),
                                 transport);
  g.dp = make_group_communicator(world.split(g.tp_rank + layout.tp * g.pp_rank, g.dp_rank, "dp"),
                                 transport);
  // The pipeline's point-to-point messages stay on MPI (staged through the host for a device
  // backend) even under NCCL: NCCL matches sends to receives by issue order alone, with no
  // tags, and 1F1B lets two neighbouring stages each send before they receive, which NCCL's
  // in-order streams would deadlock on. Only TP and DP collectives use NCCL.
  GroupTransport pp_transport = transport;
  if (pp_transport.comm == "nccl") pp_transport.comm = "mpi";
  g.pp = make_group_communicator(world.split(g.tp_rank + layout.tp * g.dp_rank, g.pp_rank, "pp"),
                                 pp_transport);
  return g;
}

}  // namespace bottle
