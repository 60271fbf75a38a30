#pragma once
// What ends an mpirun that waits for a host that never answers (docs/design.md §23).
//
// When a rank fails, Open MPI's mpirun kills every rank and then waits until each host's
// daemon says its ranks are gone. A host that is stopped (SIGSTOP, a kernel hang) never says
// so, and mpirun waits for it forever (one cut off, a dead NIC, until TCP gives up, about 15
// minutes): the scheduler never learns that the job is over. Measured on the emulated cluster
// (tools/cluster/): the rank that reports the stall and every rank on a healthy host are gone
// within a second or two of its MPI_Abort, the healthy hosts' daemons exit, and mpirun alone
// stays. Nothing inside a rank can outlast mpirun's kill, so the rule is kept by a process of
// its own: a guard, forked by each rank that mpirun started itself (a rank on mpirun's host),
// in a session of its own so that the kill of the rank's process group spares it. When its
// rank ends without having finished MPI (killed, aborted, crashed), the guard gives mpirun
// kLauncherGraceSeconds to end; if the same mpirun is still there then, the guard says so on
// mpirun's stderr and kills it (SIGKILL). The daemons of the healthy hosts lose mpirun and
// end their ranks themselves; the stopped host's do the same once it wakes.

namespace bottle {

// Seconds the guard leaves mpirun to end the job by itself once its rank has ended: mpirun
// ends a job it can reach within one or two (it kills its ranks with SIGTERM, SIGKILL a second
// later, and hears from every daemon).
inline constexpr int kLauncherGraceSeconds = 5;

// Called once per process, before MPI starts (nothing of MPI must be in the guard). Starts the
// guard when this process is a rank of a job of several ranks whose parent is the job's
// launcher: mpirun, mpiexec, orterun (Open MPI 4) or prterun (Open MPI 5), as
// /proc/PPID/comm names it. Elsewhere (a rank under a remote host's daemon, under srun, or a
// process started alone) it does nothing: the launcher is then not this host's to end.
void start_launcher_guard();

// After MPI_Finalize returned: the rank ends as the job meant, and mpirun ends it on its own
// (or is ended by the guard of a rank that did not get here). The guard exits at once.
void stand_down_launcher_guard();

}  // namespace bottle
