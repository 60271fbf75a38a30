#pragma once
// Which thread a stop signal (SIGINT, SIGTERM, SIGHUP, SIGUSR1) reaches. The kernel hands a signal sent
// to the process to any thread that does not block it: an OpenMP worker, oneDNN's, Open MPI's
// progress threads. There it interrupts whatever system call the thread waits in, and a
// library that does not retry after EINTR goes on with a half-done call. So the process blocks
// the stop signals before it starts any thread (every thread inherits the block), starts its
// helper threads, and then unblocks them in the main thread alone: the main thread is the only
// one a stop signal ever interrupts, and its handler (train's) only records it.
#include <csignal>

namespace bottle {

// Blocks SIGINT, SIGTERM, SIGHUP and SIGUSR1 in the calling thread, so that threads it starts from now
// on are born with them blocked; a process forked meanwhile (Open MPI's singleton daemon)
// unblocks them before it execs, so that it still ends on a signal.
void block_stop_signals();
// Unblocks them in the calling thread only (signals that came meanwhile arrive now).
void unblock_stop_signals();
// Starts OpenMP's thread pool now, from the calling thread: called while the stop signals are
// blocked, its workers are born with them blocked. (A later, larger pool, --threads, adds
// threads that may take a signal, which then only sets train's flag.)
void start_worker_threads();

}  // namespace bottle
