// sys/launcher_guard.h: a rank that mpirun started on its own host leaves a guard that ends
// mpirun (SIGKILL, saying why on mpirun's stderr) when the rank ended without finishing MPI and
// mpirun has not ended the job kLauncherGraceSeconds later, as when it waits for a stopped host
// (tests/cluster/faults.sh shows that case on the emulated cluster). Here a shell started under
// the name "mpirun" plays a launcher that never ends: it starts launcher_guard_probe as its
// child and then waits. The guard leaves alone a launcher whose rank finished MPI, and any
// parent that is not a launcher.
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <string>

#include "sys/launcher_guard.h"
#include "sys/subprocess.h"

namespace bottle::testing {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  ProcessResult result;
  double seconds = 0;
};

class LauncherGuard : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string pattern = (fs::temp_directory_path() / "bottle-launcher-guard.XXXXXX").string();
    ASSERT_NE(::mkdtemp(pattern.data()), nullptr);
    dir_ = pattern;
    // /proc/PID/comm is the name the program was started under, here the link's.
    fs::create_symlink("/bin/sh", dir_ / "mpirun");
    fs::create_symlink("/bin/sh", dir_ / "launcher");
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Starts `launcher` (a shell under that name) that runs the probe in MODE as a rank of two,
  // then waits `tenths` tenths of a second in steps (so that a kill leaves no long sleep
  // behind) and exits 0.
  std::future<Outcome> start(const std::string& launcher, const std::string& mode, int tenths) {
    const std::string script = std::string("OMPI_COMM_WORLD_SIZE=2 OMPI_COMM_WORLD_RANK=0 ") +
                               LAUNCHER_GUARD_PROBE + " " + mode + "; i=0; while [ $i -lt " +
                               std::to_string(tenths) +
                               " ]; do sleep 0.1; i=$((i + 1)); done; exit 0";
    const std::string program = (dir_ / launcher).string();
    return std::async(std::launch::async, [program, script] {
      const auto begin = std::chrono::steady_clock::now();
      Outcome outcome;
      outcome.result = run_process({.argv = {program, "-c", script}, .capture_stderr = true});
      outcome.seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
      return outcome;
    });
  }

  fs::path dir_;
};

bool killed_by(const ProcessResult& r, int signal) {
  return r.started() && WIFSIGNALED(r.wait_status) && WTERMSIG(r.wait_status) == signal;
}

TEST_F(LauncherGuard, EndsALauncherThatOutlivesItsRankAndLeavesTheOthersAlone) {
  // The three at once, so that the test waits out the grace once; they share nothing.
  auto stuck = start("mpirun", "abnormal", 300);          // 30 s unless the guard ends it
  auto finished = start("mpirun", "finished", 60);        // past the grace, then exits 0
  auto not_launcher = start("launcher", "abnormal", 60);  // a parent that is no launcher

  const Outcome s = stuck.get();
  EXPECT_TRUE(killed_by(s.result, SIGKILL)) << s.result.ending() << "\n" << s.result.output;
  EXPECT_GE(s.seconds, kLauncherGraceSeconds - 0.5) << "the guard did not wait for the grace";
  EXPECT_LT(s.seconds, 25.0);
  EXPECT_NE(s.result.output.find("mpirun (pid "), std::string::npos) << s.result.output;
  EXPECT_NE(s.result.output.find("after its rank 0 ended"), std::string::npos) << s.result.output;
  EXPECT_NE(s.result.output.find("ending mpirun (SIGKILL)"), std::string::npos) << s.result.output;

  const Outcome f = finished.get();
  EXPECT_TRUE(f.result.succeeded()) << f.result.ending() << "\n" << f.result.output;
  EXPECT_EQ(f.result.output, "");

  const Outcome n = not_launcher.get();
  EXPECT_TRUE(n.result.succeeded()) << n.result.ending() << "\n" << n.result.output;
  EXPECT_EQ(n.result.output, "");
}

}  // namespace
}  // namespace bottle::testing
