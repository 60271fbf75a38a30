#include "apps/subprocess.h"

#include <cstdio>
#include <memory>

#include "core/error.h"

namespace bottle {

std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char ch : s) out += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return out + "'";
}

ShellResult run_shell(const std::string& command) {
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  BOTTLE_CHECK(pipe, "cannot run: {}", command);
  ShellResult r;
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof(buf), pipe.get())) r.output.append(buf, n);
  r.status = ::pclose(pipe.release());
  return r;
}

std::string run_command(const std::string& command) {
  const ShellResult r = run_shell(command + " 2>&1");
  BOTTLE_CHECK(r.status == 0, "command failed (status {}): {}\n{}", r.status, command,
               r.output.size() > 4000 ? r.output.substr(r.output.size() - 4000) : r.output);
  return r.output;
}

}  // namespace bottle
