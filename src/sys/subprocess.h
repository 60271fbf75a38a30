#pragma once
// The one way bottle starts another program (gnuplot drawing a plot, the PyTorch peer, the runs
// of `bench paper`, the tokenizer peers): posix_spawn, which unlike fork runs no atfork handler
// and copies no address space, with the child's stdin /dev/null, its stdout (and, when asked,
// its stderr) collected into an unnamed file in memory that is read back when it ends (a pipe
// could fill up and stall it while nothing reads), and its signals as a program expects them:
// none blocked, the stop signals at their default action, although a training run keeps them
// blocked (sys/stop_signals.h).
#include <string>
#include <vector>

namespace bottle {

struct ProcessRun {
  std::vector<std::string> argv;  // argv[0] is looked up on PATH
  bool capture_stderr = false;    // stderr into `output` too; else it goes where bottle's goes
  // A process group of its own: a terminal's Ctrl-C or hang-up, which reach the whole
  // foreground group, then stop bottle (which ends cleanly and waits for the child) and not the
  // child. Otherwise the child is in bottle's group and a Ctrl-C ends both.
  bool own_process_group = false;
};

struct ProcessResult {
  int start_error = 0;  // posix_spawn's errno when the program did not start (ENOENT: not found)
  int wait_status = 0;  // waitpid's, once it started
  std::string output;   // all it wrote to stdout (and stderr when captured)

  bool started() const { return start_error == 0; }
  // Started, exited, and with status 0.
  bool succeeded() const;
  // How it ended: "exit status 2", "killed by signal 9", or why it did not start.
  std::string ending() const;
};

// Runs `run` to its end. Throws only when the process cannot be set up or waited for (no file
// for its output, waitpid failing), naming argv[0]; a program that does not start is a result
// with start_error set, so that the caller can say what to install.
ProcessResult run_process(const ProcessRun& run);

}  // namespace bottle
