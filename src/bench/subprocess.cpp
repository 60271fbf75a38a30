#include "bench/subprocess.h"

#include <utility>

#include "core/error.h"
#include "sys/subprocess.h"

namespace bottle {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

ShellResult run_shell(const std::string& command) {
  ProcessResult r = run_process({.argv = {"/bin/sh", "-c", command}});
  BOTTLE_CHECK(r.started(), "cannot run: {} ({})", command, r.ending());
  return {.status = r.wait_status, .output = std::move(r.output)};
}

std::string run_command(const std::string& command) {
  const ShellResult r = run_shell(command + " 2>&1");
  BOTTLE_CHECK(r.status == 0, "command failed (status {}): {}\n{}", r.status, command,
               r.output.size() > 4000 ? r.output.substr(r.output.size() - 4000) : r.output);
  return r.output;
}

}  // namespace bottle
