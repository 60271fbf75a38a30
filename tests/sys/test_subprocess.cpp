// sys/subprocess.h: the one way bottle starts another program. Its output is collected whole
// (more than a pipe holds), stderr only when asked, stdin is /dev/null, how it ended is told
// apart (exit status, signal, not started), a process group of its own only when asked, and
// the stop signals reach it at their default action although the caller blocks them (as a
// training run does).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <string>

#include "sys/stop_signals.h"
#include "sys/subprocess.h"

namespace bottle::testing {
namespace {

ProcessResult shell(const std::string& script, bool capture_stderr = false,
                    bool own_process_group = false) {
  return run_process({.argv = {"/bin/sh", "-c", script},
                      .capture_stderr = capture_stderr,
                      .own_process_group = own_process_group});
}

TEST(Subprocess, CollectsAllOfItsOutputAndItsExitStatus) {
  // 1 MiB: more than a pipe buffer, which would stall a child that nothing reads meanwhile.
  const ProcessResult r = shell("head -c 1048576 /dev/zero; echo; exit 3");
  ASSERT_TRUE(r.started());
  EXPECT_EQ(r.output.size(), size_t(1048577));
  EXPECT_FALSE(r.succeeded());
  EXPECT_EQ(r.ending(), "exit status 3");
  EXPECT_TRUE(shell("true").succeeded());
}

TEST(Subprocess, StderrIsCollectedOnlyWhenAsked) {
  EXPECT_EQ(shell("echo out; echo err >&2", false).output, "out\n");
  EXPECT_EQ(shell("echo out; echo err >&2", true).output, "out\nerr\n");
}

TEST(Subprocess, StdinIsEmpty) { EXPECT_EQ(shell("wc -c").output, "0\n"); }

TEST(Subprocess, AProgramNotFoundIsAResultNotAThrow) {
  const ProcessResult r = run_process({.argv = {"bottle-no-such-program-7f3a"}});
  EXPECT_FALSE(r.started());
  EXPECT_EQ(r.start_error, ENOENT);
  EXPECT_FALSE(r.succeeded());
  EXPECT_NE(r.ending().find("did not start"), std::string::npos) << r.ending();
}

TEST(Subprocess, AKillingSignalIsToldApartFromAnExitStatus) {
  const ProcessResult r = shell("kill -KILL $$");
  ASSERT_TRUE(r.started());
  EXPECT_EQ(r.ending(), "killed by signal 9");
}

TEST(Subprocess, StopSignalsReachTheChildAtTheirDefaultAlthoughTheCallerBlocksThem) {
  block_stop_signals();  // as a training run keeps them
  const ProcessResult r = shell("kill -TERM $$; sleep 5");
  unblock_stop_signals();
  ASSERT_TRUE(r.started());
  EXPECT_EQ(r.ending(), "killed by signal 15");
}

TEST(Subprocess, AProcessGroupOfItsOwnOnlyWhenAsked) {
  // ps is not everywhere: the shell reads its process group from /proc/self/stat (field 5).
  const std::string pgid = "cut -d' ' -f5 /proc/self/stat";
  const std::string ours = std::to_string(::getpgrp());
  EXPECT_EQ(shell(pgid, false, false).output, ours + "\n");
  const ProcessResult own = shell("echo $$; " + pgid, false, true);
  const std::string pid = own.output.substr(0, own.output.find('\n'));
  // `cut` runs in the shell's group, which the shell leads: its pgid is the shell's pid.
  EXPECT_EQ(own.output, pid + "\n" + pid + "\n");
  EXPECT_NE(pid, ours);
}

}  // namespace
}  // namespace bottle::testing
