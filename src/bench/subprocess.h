#pragma once
// Shell commands run from bottle (the PyTorch peer, the runs of `bench paper`), through
// sys/subprocess.h's run_process: /bin/sh -c, stdin /dev/null, in bottle's process group.
#include <string>

namespace bottle {

struct ShellResult {
  int status = -1;     // waitpid's (as pclose reported it): 0 when the command succeeded
  std::string output;  // what it wrote to stdout (append " 2>&1" for stderr too)
};

// Runs `command` with /bin/sh and collects its output; throws when it cannot start.
ShellResult run_shell(const std::string& command);

// One word for a POSIX shell, whatever `s` holds.
std::string shell_quote(const std::string& s);

// Runs a shell command, returns its stdout and stderr; throws with their tail when it fails.
std::string run_command(const std::string& command);

}  // namespace bottle
