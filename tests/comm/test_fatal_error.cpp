// report_fatal_error ends the whole job, non-zero and within seconds, whether one rank or
// every rank fails; see fatal_error_probe.cpp for what each mode does.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdio>
#include <string>

namespace {

struct JobResult {
  int status = -1;     // exit code, or 128 + signal
  std::string errors;  // stderr of the whole job
  double seconds = 0;
};

JobResult run(const std::string& command) {
  JobResult r;
  const auto start = std::chrono::steady_clock::now();
  // `timeout` turns a hang into a failure (status 124) instead of blocking the suite.
  FILE* pipe = popen(("timeout -k 5 60 " + command + " 2>&1 >/dev/null").c_str(), "r");
  if (!pipe) return r;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) r.errors.append(buffer, n);
  const int status = pclose(pipe);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

JobResult run_job(int ranks, const std::string& mode) {
  return run(std::string(BOTTLE_MPIEXEC) + " " + BOTTLE_MPIEXEC_NUMPROC_FLAG + " " +
             std::to_string(ranks) + " --oversubscribe " + FATAL_ERROR_PROBE + " " + mode);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(FatalError, CleanJobExitsZero) {
  const JobResult r = run_job(2, "clean");
  EXPECT_EQ(r.status, 0) << r.errors;
}

TEST(FatalError, OneRankFailingEndsTheJob) {
  const JobResult r = run_job(2, "one");
  EXPECT_NE(r.status, 0) << r.errors;
  EXPECT_NE(r.status, 124) << "the job hung\n" << r.errors;
  EXPECT_LT(r.seconds, 20) << r.errors;
  EXPECT_TRUE(contains(r.errors, "bottle: error: rank 1: probe failure on one rank")) << r.errors;
  EXPECT_FALSE(contains(r.errors, "bottle: error: rank 0:")) << r.errors;
  // mpirun ended the job itself: the launcher guards (sys/launcher_guard.h) had nothing to do.
  EXPECT_FALSE(contains(r.errors, "ending mpirun")) << r.errors;
}

TEST(FatalError, EveryRankFailingExitsCleanly) {
  const JobResult r = run_job(2, "all");
  EXPECT_NE(r.status, 0) << r.errors;
  EXPECT_NE(r.status, 124) << "the job hung\n" << r.errors;
  EXPECT_LT(r.seconds, 20) << r.errors;
  EXPECT_TRUE(contains(r.errors, "bottle: error: rank 0: probe failure on every rank")) << r.errors;
  EXPECT_TRUE(contains(r.errors, "bottle: error: rank 1: probe failure on every rank")) << r.errors;
  // Every rank finalized, so nobody needed the watchdog's abort, nor mpirun a guard.
  EXPECT_FALSE(contains(r.errors, "MPI_ABORT")) << r.errors;
  EXPECT_FALSE(contains(r.errors, "ending mpirun")) << r.errors;
}

TEST(FatalError, SingleProcessHasNoRankPrefix) {
  const JobResult r = run(std::string(FATAL_ERROR_PROBE) + " all");
  EXPECT_EQ(r.status, 1) << r.errors;
  EXPECT_TRUE(contains(r.errors, "bottle: error: probe failure on every rank\n")) << r.errors;
  EXPECT_FALSE(contains(r.errors, "rank 0")) << r.errors;
}

}  // namespace
