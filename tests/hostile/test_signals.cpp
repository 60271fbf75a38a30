// Issue 29, rule 1: Ctrl-C never crashes. `bottle train` runs sent one SIGINT (or SIGTERM,
// SIGHUP, SIGUSR1; SIGINT and SIGHUP to the whole process group, as a terminal sends them) at
// moments spread over the whole run: while MPI starts, while the run is set up,
// in steps, evaluations and checkpoints, and after the last step (the plot). Each must end
// with exit status 0 and either "stopped by signal N …" or "done:", never a crash (an
// instrumented build aborts on its first report, which shows here as status 134); the
// checkpoint it names is complete. Under mpirun the job stops the same way, with rank 0's
// line. Bounded in time: runs are started until the budget is spent (at least a few).
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <regex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "test_util.h"

namespace bottle::testing {
namespace {

using Clock = std::chrono::steady_clock;

class Signals : public ::testing::Test {
 public:
  void SetUp() override {
    write_random_shard(dir / "train.bin", 20000, 64, 1);
    write_random_shard(dir / "val.bin", 4000, 64, 2);
    std::ofstream(dir / "tiny.toml")
        << kTinyColaModelToml
        << fmt::format(R"([training]
steps = 40
micro_batch_size = 2
seq_len = 16
eval_interval = 5
eval_batches = 2

[data]
train = "{}"
val = "{}"

[checkpoint]
folder = "{}"
interval = 7
keep = 2

[metrics]
log_freq = 3
)",
                       dir / "train.bin", dir / "val.bin", dir / "run");
  }

  struct Outcome {
    int status = -1;  // exit status, 128 + signal when killed, -1: hung (killed after 120 s)
    std::string output;
  };

  // Whom a signal goes to: the process, as kill(1) sends it, or its whole process group, as a
  // terminal sends Ctrl-C (SIGINT) and a hang-up (SIGHUP): its children (the plot's gnuplot,
  // mpirun's ranks) get it at the same moment.
  enum class Target { process, group };

  // `argv` started with the signals at their defaults, in a process group of its own, and its
  // output in `log`.
  pid_t start(const std::vector<std::string>& argv, const std::string& log) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::setpgid(0, 0);
      // As a shell's foreground job: nothing blocked or ignored.
      sigset_t none;
      sigemptyset(&none);
      ::sigprocmask(SIG_SETMASK, &none, nullptr);
      for (int s : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) ::signal(s, SIG_DFL);
      std::FILE* out = std::freopen(log.c_str(), "w", stdout);
      if (!out || ::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) ::_exit(126);
      std::vector<char*> args;
      for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
      args.push_back(nullptr);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    if (pid > 0) ::setpgid(pid, pid);  // as the child does: whichever runs first, it exists
    return pid;
  }

  // Waits for the process `start` began (killed after 120 s) and reads its output.
  Outcome wait_for(pid_t pid, const std::string& log) {
    Outcome o;
    if (pid < 0) return o;
    const auto deadline = Clock::now() + std::chrono::seconds(120);
    int s = 0;
    while (::waitpid(pid, &s, WNOHANG) != pid) {
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &s, 0);
        s = -1;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (s != -1) o.status = WIFEXITED(s) ? WEXITSTATUS(s) : 128 + WTERMSIG(s);
    o.output = read_text(log);
    return o;
  }

  // Whether the process has ended (it stays waitable).
  static bool ended(pid_t pid) {
    siginfo_t info{};
    return ::waitid(P_PID, id_t(pid), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid;
  }

  // Waits until the process's output has a step line (or it ended, or a minute went by).
  void wait_for_a_step(pid_t pid, const std::string& log) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (read_text(log).find("\nstep ") == std::string::npos && !ended(pid) &&
           Clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }

  static std::string read_text(const std::string& path) {
    std::ifstream in(path);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  }

  // `argv` started as `start` does, sent `sig` `delay` seconds after the start, then waited for.
  Outcome interrupt(const std::vector<std::string>& argv, double delay, int sig,
                    Target target = Target::process) {
    const std::string log = dir / "out.log";
    const pid_t pid = start(argv, log);
    if (pid < 0) return {};
    std::this_thread::sleep_for(std::chrono::duration<double>(delay));
    ::kill(target == Target::group ? -pid : pid, sig);
    return wait_for(pid, log);
  }

  // A clean end: exit 0, the run's last word, and the checkpoint it names complete.
  void expect_clean_end(const Outcome& o, int sig) {
    // A signal that comes before the process reaches main (exec, the dynamic loader: the
    // first few milliseconds) takes the default action, which no program can change: the
    // process ends by the signal having written nothing, and that is a clean end too.
    if (o.status == 128 + sig && o.output.empty()) {
      EXPECT_FALSE(fs::exists(dir / "run")) << "ended by the signal, yet a run folder exists";
      return;
    }
    ASSERT_EQ(o.status, 0) << (o.status < 0 ? "hung" : "crashed or failed") << ":\n" << o.output;
    std::smatch m;
    const std::regex after(fmt::format("stopped by signal {} after step ([0-9]+)", sig));
    const bool stopped_before =
        o.output.find(fmt::format("stopped by signal {} before step", sig)) != std::string::npos;
    if (std::regex_search(o.output, m, after)) {
      const std::string step = fmt::format("step_{:08d}", std::stoll(m[1].str()));
      EXPECT_TRUE(fs::exists(fs::path(dir / "run") / step / "trainer_state.json")) << o.output;
      EXPECT_NE(o.output.find("checkpoint " + (dir / "run/") + step), std::string::npos)
          << o.output;
    } else {
      EXPECT_TRUE(stopped_before || o.output.find("done: 40 steps") != std::string::npos)
          << o.output;
    }
    EXPECT_EQ(o.output.find("internal error"), std::string::npos) << o.output;
  }

#ifdef BOTTLE_MPIEXEC
  // `mpirun -np 2 bottle train` (2 data-parallel ranks) sent `sig` once it has trained a step:
  // the delay doubles until the run stopped after one.
  Outcome stop_mpirun_job(int sig) {
    const std::vector<std::string> job = {
        BOTTLE_MPIEXEC, BOTTLE_MPIEXEC_NUMPROC_FLAG, "2", "--oversubscribe", bottle_binary(),
        "train", dir / "tiny.toml", "--set", "parallel.dp=2", "--set", "training.steps=100000",
        // A line a hundred steps, as a real run's log
        // rather than thousands a second for mpirun to
        // forward.
        "--set", "metrics.log_freq=100"};
    Outcome o;
    for (double delay = 2; delay < 40; delay *= 2) {
      fs::remove_all(dir / "run");
      o = interrupt(job, delay, sig);
      // Rank 0's notice: the signal came while it trained.
      if (o.output.find("bottle: stop signal received:") != std::string::npos) break;
    }
    return o;
  }
#endif

  TempDir dir;
};

// One signal at a random moment of the run, runs started until the time budget is spent.
TEST_F(Signals, AStopSignalAtAnyMomentEndsCleanly) {
  // A full run first: how long one takes on this machine (and this build) spreads the
  // moments over setup, steps, evaluations, checkpoints and the plot.
  const auto t0 = Clock::now();
  const std::vector<std::string> train = {bottle_binary(), "train", dir / "tiny.toml"};
  const CommandResult full = run(fmt::format("{} train {}", bottle_binary(), dir / "tiny.toml"));
  ASSERT_EQ(full.status, 0) << full.output;
  const double whole = std::chrono::duration<double>(Clock::now() - t0).count();
  std::mt19937 rng(29);
  std::uniform_real_distribution<double> moment(0.0, whole * 1.1);
  const int signals[] = {SIGINT, SIGINT, SIGTERM, SIGINT, SIGHUP, SIGUSR1};
  int runs = 0;
  const auto budget = Clock::now() + std::chrono::seconds(60);
  while (runs < 4 || (Clock::now() < budget && runs < 24)) {
    fs::remove_all(dir / "run");
    const double delay = moment(rng);
    const int sig = signals[runs % 6];
    SCOPED_TRACE(
        fmt::format("run {}: signal {} after {:.2f} s of {:.2f}", runs, sig, delay, whole));
    // Ctrl-C and a closed terminal reach the whole process group, the others bottle alone.
    const Outcome o = interrupt(train, delay, sig,
                                sig == SIGINT || sig == SIGHUP ? Target::group : Target::process);
    expect_clean_end(o, sig);
    if (HasFatalFailure()) return;
    ++runs;
  }
}

// No thread of a training run takes a stop signal: every thread (the main one, OpenMP's workers,
// Open MPI's progress threads) has them blocked, and the watcher's thread ("stop signals") reads
// them from a signalfd, so that no handler lands on a thread in a oneDNN GEMM
// (sys/stop_signals.h). Read from /proc while the run trains, on two OpenMP threads.
TEST_F(Signals, NoThreadOfARunTakesAStopSignal) {
  const std::string log = dir / "threads.log";
  ::setenv("OMP_NUM_THREADS", "2", 1);
  const pid_t pid =
      start({bottle_binary(), "train", dir / "tiny.toml", "--set", "training.steps=100000"}, log);
  ::unsetenv("OMP_NUM_THREADS");
  ASSERT_GT(pid, 0);
  // Training: a step line is written (the setup has started every thread by then).
  wait_for_a_step(pid, log);
  // SigBlk of each thread: bits SIGHUP, SIGINT, SIGUSR1, SIGTERM (signal n is bit n - 1).
  uint64_t stop_bits = 0;
  for (const int sig : {SIGHUP, SIGINT, SIGUSR1, SIGTERM}) stop_bits |= uint64_t{1} << (sig - 1);
  int threads = 0, watchers = 0;
  for (const auto& task : fs::directory_iterator(fmt::format("/proc/{}/task", pid))) {
    std::ifstream status(task.path() / "status");
    uint64_t blocked = 0;
    std::string name;
    for (std::string line; std::getline(status, line);) {
      if (line.starts_with("SigBlk:")) blocked = std::stoull(line.substr(7), nullptr, 16);
      if (line.starts_with("Name:")) name = line.substr(line.find_first_not_of(" \t", 5));
    }
    EXPECT_EQ(blocked & stop_bits, stop_bits) << "thread " << task.path().filename() << " (" << name
                                              << "): SigBlk " << std::hex << blocked;
    watchers += name == "stop signals";
    ++threads;
  }
  EXPECT_GE(threads, 3) << "no OpenMP worker to check";
  EXPECT_EQ(watchers, 1);
  ::kill(pid, SIGTERM);
  const Outcome o = wait_for(pid, log);
  expect_clean_end(o, SIGTERM);
}

// A run started without mpirun (an Open MPI singleton) starts no helper process. Open MPI's
// singleton daemon (orted) is a child that leaves the run's process group only once it runs,
// so a Ctrl-C in that window killed it and MPI_Init aborted the run: run 16 of
// AStopSignalAtAnyMomentEndsCleanly, SIGHUP to the group 0.08 s in, once in CI. Read from
// /proc while the run trains: no process has the run as its parent.
TEST_F(Signals, ARunOutsideMpirunStartsNoHelperProcess) {
  const std::string log = dir / "children.log";
  const pid_t pid =
      start({bottle_binary(), "train", dir / "tiny.toml", "--set", "training.steps=100000"}, log);
  ASSERT_GT(pid, 0);
  wait_for_a_step(pid, log);
  std::vector<std::string> children;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    std::ifstream stat(entry.path() / "stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    // pid (comm) state ppid ...: comm may hold spaces, so read after its closing parenthesis.
    const size_t close = line.rfind(')');
    if (close == std::string::npos) continue;
    std::istringstream rest(line.substr(close + 1));
    std::string state;
    pid_t parent = 0;
    rest >> state >> parent;
    if (parent == pid) children.push_back(line.substr(0, close + 1));
  }
  EXPECT_TRUE(children.empty()) << "the run's children: "
                                << fmt::format("{}", fmt::join(children, ", "));
  ::kill(pid, SIGTERM);
  const Outcome o = wait_for(pid, log);
  expect_clean_end(o, SIGTERM);
}

// A burst of signals while the steps run: SIGINTs a few µs apart once the run trains, until it
// says it stopped (checked every 200), so that many land during the rest of the step. With a
// handler on the main thread, one landing in a oneDNN JIT GEMM wrote its frame into the heap
// (sys/stop_signals.h): 5 runs of this in 6 crashed. With configs/tiny.toml's shapes, whose
// GEMMs are oneDNN's JIT kernels, and 4 micro-batches a step for a longer step.
TEST_F(Signals, ABurstOfSignalsDuringTheStepsEndsCleanly) {
  const std::string log = dir / "out.log";
  const pid_t pid =
      start({bottle_binary(), "train", BOTTLE_SOURCE_DIR "/configs/tiny.toml", "--set",
             "data.train=" + (dir / "train.bin"), "--set", "data.val=" + (dir / "val.bin"), "--set",
             "checkpoint.folder=" + (dir / "run"), "--set", "training.steps=100000", "--set",
             "training.eval_batches=2", "--set", "training.grad_accum_steps=4"},
            log);
  ASSERT_GT(pid, 0);
  wait_for_a_step(pid, log);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int sent = 0;
  // After the run a second signal ends the process, as it should: the burst ends before that.
  while (sent < 20000 && !ended(pid) &&
         (sent % 200 || read_text(log).find("stopped by signal") == std::string::npos)) {
    ::kill(pid, SIGINT);
    ++sent;
    std::this_thread::sleep_for(std::chrono::microseconds(5));
  }
  SCOPED_TRACE(fmt::format("{} signals sent", sent));
  expect_clean_end(wait_for(pid, log), SIGINT);
}

// A stopped run resumes where it stopped: the checkpoint the signal wrote is whole.
TEST_F(Signals, AStoppedRunResumes) {
  // A run too long to end by itself; the delay grows until the signal came after a step.
  const std::vector<std::string> train = {bottle_binary(), "train", dir / "tiny.toml", "--set",
                                          "training.steps=100000"};
  Outcome o;
  std::smatch m;
  const std::regex after("stopped by signal 2 after step ([0-9]+)");
  for (double delay = 0.5; delay < 60; delay *= 2) {
    fs::remove_all(dir / "run");
    o = interrupt(train, delay, SIGINT);
    ASSERT_EQ(o.status, 0) << o.output;
    if (std::regex_search(o.output, m, after)) break;
  }
  ASSERT_TRUE(std::regex_search(o.output, m, after)) << o.output;
  const int64_t stopped = std::stoll(m[1].str());
  const CommandResult resumed = run(fmt::format("{} train {} --resume --set training.steps={}",
                                                bottle_binary(), dir / "tiny.toml", stopped + 2));
  EXPECT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(
      resumed.output.find(fmt::format("resumed from {} at step {}",
                                      dir / fmt::format("run/step_{:08d}", stopped), stopped)),
      std::string::npos)
      << resumed.output;
}

#ifdef BOTTLE_MPIEXEC
// Under mpirun, SIGUSR1 to the launcher: Open MPI forwards it to every rank and waits for the
// job; the ranks stop after the same step, rank 0 says which, the checkpoint is complete and
// the job (mpirun too) exits 0.
TEST_F(Signals, UnderMpirunSigusr1StopsTheJobWithACheckpoint) {
  const Outcome o = stop_mpirun_job(SIGUSR1);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_EQ(o.output.find("bottle: error"), std::string::npos) << o.output;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(
      o.output, m, std::regex(fmt::format("stopped by signal {} after step ([0-9]+)", SIGUSR1))))
      << o.output;
  EXPECT_TRUE(fs::exists(fs::path(dir / "run") /
                         fmt::format("step_{:08d}", std::stoll(m[1].str())) / "trainer_state.json"))
      << o.output;
  // Rank 0 alone says at once what happens; SIGUSR1 needs no advice.
  EXPECT_EQ(count_occurrences(o.output, "bottle: stop signal received:"), 1) << o.output;
  EXPECT_EQ(o.output.find("send SIGUSR1 to mpirun"), std::string::npos) << o.output;
}

// Under mpirun: SIGINT to the launcher, which sends SIGTERM to every rank and kills them one
// second later (Open MPI's odls_base_sigkill_timeout). Either the ranks finish the step and save
// within that second ("stopped by signal ... after step N", the checkpoint complete), or the
// launcher kills them first, and then rank 0 has already said, at the signal, which checkpoint
// the run leaves; that one is complete, and --resume continues from it, saying that the save
// of the killed step did not complete. Never a crash, an internal error or a silent loss.
TEST_F(Signals, UnderMpirunACtrlCSavesOrSaysWhatIsSaved) {
  const Outcome o = stop_mpirun_job(SIGINT);
  EXPECT_EQ(o.output.find("internal error"), std::string::npos) << o.output;
  for (const char* crash : {"Segmentation fault", "corrupted", "Aborted", "AddressSanitizer"})
    EXPECT_EQ(o.output.find(crash), std::string::npos) << o.output;
  std::smatch m;
  // Open MPI 4.1's mpirun exits 1 after it forwarded a SIGINT, whatever the ranks returned
  // (`mpirun sh -c 'trap "exit 0" TERM; ...'` too): its status says nothing of theirs.
  if (std::regex_search(o.output, m, std::regex("stopped by signal [0-9]+ after step ([0-9]+)"))) {
    std::printf("the job saved within mpirun's grace period\n");
    EXPECT_TRUE(o.status == 0 || o.status == 1) << o.output;
    EXPECT_TRUE(
        fs::exists(fs::path(dir / "run") / fmt::format("step_{:08d}", std::stoll(m[1].str())) /
                   "trainer_state.json"))
        << o.output;
    return;
  }
  // Killed by the launcher: the notice named the newest complete checkpoint, or none.
  ASSERT_TRUE(std::regex_search(
      o.output, m,
      std::regex("bottle: stop signal received: finishing step ([0-9]+) \\(or the next, if another "
                 "rank gets the signal later\\)"
                 ", then saving a checkpoint and exiting; the newest "
                 "saved checkpoint, until \"stopped by signal\" is "
                 "printed, is ([^\n]+)\n")))
      << o.output;
  const std::string named = m[2].str();
  std::printf("mpirun killed the job first; it had named %s\n", named.c_str());
  EXPECT_NE(o.output.find("send SIGUSR1 to mpirun"), std::string::npos) << o.output;
  if (named.starts_with("none")) return;
  EXPECT_TRUE(fs::exists(fs::path(named) / "trainer_state.json")) << o.output;
  ASSERT_TRUE(std::regex_search(named, m, std::regex("step_([0-9]+)$"))) << named;
  const CommandResult resumed = run(fmt::format(
      "{} {} 2 --oversubscribe {} train {} --set parallel.dp=2 --resume --set training.steps={}",
      BOTTLE_MPIEXEC, BOTTLE_MPIEXEC_NUMPROC_FLAG, bottle_binary(), dir / "tiny.toml",
      // Past the step the ranks were finishing, whose save may have completed unseen.
      std::stoll(m[1].str()) + 20));
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from "), std::string::npos) << resumed.output;
}

// The same when the save cannot fit in the grace period (a large model's: here every save
// takes 5 s more, BOTTLE_FAILPOINT=slow_checkpoint:5). The run was saved once before; mpirun
// kills the ranks in the middle of the stop's save. The notice named that earlier checkpoint,
// which is complete; --resume says that the save of the killed step did not complete and
// continues from it.
// No evaluation in the stopped run: from the Ctrl-C to the SIGKILL mpirun's event loop sleeps
// and reads none of the ranks' output, so rank 0's "val loss" lines (thousands of tiny steps a
// second, every fifth evaluated) filled its terminal and held it in a write before it could
// save, in 3 runs of 28 here (CI saw it once); a real run prints a line every few seconds.
TEST_F(Signals, UnderMpirunASaveCutShortIsSaidAndResumedFromTheOneBefore) {
  const std::string mpirun =
      fmt::format("{} {} 2 --oversubscribe {} train {} --set parallel.dp=2", BOTTLE_MPIEXEC,
                  BOTTLE_MPIEXEC_NUMPROC_FLAG, bottle_binary(), dir / "tiny.toml");
  const CommandResult first = run(mpirun + " --set training.steps=4");
  ASSERT_EQ(first.status, 0) << first.output;
  ASSERT_TRUE(fs::exists(dir / "run/step_00000004/trainer_state.json")) << first.output;
  ::setenv("BOTTLE_FAILPOINT", "slow_checkpoint:5", 1);
  const Outcome o = interrupt(
      {BOTTLE_MPIEXEC, BOTTLE_MPIEXEC_NUMPROC_FLAG, "2", "--oversubscribe", bottle_binary(),
       "train", dir / "tiny.toml", "--set", "parallel.dp=2", "--resume", "--set",
       "training.steps=100000", "--set", "checkpoint.interval=0", "--set", "metrics.log_freq=100",
       "--set", "training.eval_interval=0"},
      3, SIGINT);
  ::unsetenv("BOTTLE_FAILPOINT");
  // The kill landed in the save: its temporary folder is there for --resume to report.
  bool save_begun = false;
  for (const auto& e : fs::directory_iterator(dir / "run"))
    save_begun |= e.path().filename().string().starts_with(".tmp-step_");
  EXPECT_TRUE(save_begun) << "mpirun killed the ranks before the stop's save began:\n" << o.output;
  std::smatch m;
  EXPECT_FALSE(std::regex_search(o.output, m, std::regex("stopped by signal [0-9]"))) << o.output;
  EXPECT_EQ(o.output.find("internal error"), std::string::npos) << o.output;
  ASSERT_TRUE(std::regex_search(
      o.output, m,
      std::regex(
          "stop signal received: finishing step ([0-9]+) \\(or the next, if another rank gets "
          "the signal later\\), then saving a checkpoint and "
          "exiting; the newest saved checkpoint, until \"stopped by signal\" is "
          "printed, is ([^\n]+)\n")))
      << o.output;
  EXPECT_EQ(m[2].str(), dir / "run/step_00000004") << o.output;
  const CommandResult resumed = run(mpirun + " --resume --set training.steps=6");
  ASSERT_EQ(resumed.status, 0) << resumed.output;
  EXPECT_TRUE(std::regex_search(resumed.output,
                                std::regex("the save of step [0-9]+ did not complete \\(the "
                                           "process ended while writing it\\); resuming from " +
                                           dir / "run/step_00000004")))
      << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir / "run/step_00000004 at step 4"),
            std::string::npos)
      << resumed.output;
}
#endif

}  // namespace
}  // namespace bottle::testing
