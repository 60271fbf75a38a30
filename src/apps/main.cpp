// `bottle`: the command line. Every error a user can cause ends here as one message on
// stderr and exit status 1, on every rank of an mpirun job, without a hang.
#include <fmt/ranges.h>
#include <omp.h>
#include <sys/resource.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <new>
#include <string>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "apps/version.h"
#include "comm/communicator.h"
#include "core/error.h"
#include "sys/stop_signals.h"
#include "train/memory_plan.h"
#include "train/train_config.h"

namespace {

// What a failed allocation says: the memory available, and the address-space limit where
// ulimit -v sets one below it.
std::string out_of_memory_message() {
  rlimit limit{};
  const bool capped = getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
  return fmt::format(
      "out of memory: an allocation failed with {} available (MemAvailable, within the "
      "cgroup's limit){}; lower the batch, the sequence length or the model's size",
      bottle::format_bytes(bottle::available_memory_bytes()),
      capped ? fmt::format(", and the process's address space is limited to {} (ulimit -v), "
                           "which is the limit here",
                           bottle::format_bytes(size_t(limit.rlim_cur)))
             : std::string());
}

// OpenMP takes its thread count from OMP_NUM_THREADS, which --threads' bound does not
// reach: libgomp crashes starting 100,000 threads. The same bound applies to both.
void check_openmp_threads() {
  if (omp_get_max_threads() <= bottle::kMaxThreads) return;
  const char* env = std::getenv("OMP_NUM_THREADS");
  bottle::fail(
      "the environment's OMP_NUM_THREADS ({}) asks for {} OpenMP threads, more than bottle runs "
      "(at most {}); set it to at most this machine's {} core(s), or unset it",
      env ? env : "unset", omp_get_max_threads(), bottle::kMaxThreads, omp_get_num_procs());
}

}  // namespace

int main(int argc, char** argv) {
  // Before any thread exists: MPI's and OpenMP's threads are born with the stop signals
  // blocked, so that no signal handler ever runs on a thread in a GEMM (sys/stop_signals.h).
  bottle::block_stop_signals();
  // A file-size limit (ulimit -f) would kill the process with SIGXFSZ in the middle of a
  // write; ignored, the write fails with EFBIG and the error names the file being written.
  std::signal(SIGXFSZ, SIG_IGN);
  CLI::App app{"bottle: a trainer for low-rank bottleneck LLaMA models"};
  app.require_subcommand(1);
  // Every option's --help line shows its default (subcommands inherit this as they are made).
  app.option_defaults()->always_capture_default();
  app.set_version_flag("--version", [] { return bottle::version_text(); });
  std::map<CLI::App*, bottle::Command> commands;
  CLI::App* train = app.add_subcommand("train", "train a model from a TOML configuration");
  commands[train] = bottle::add_train_command(*train);
  CLI::App* eval = app.add_subcommand("eval", "mean cross-entropy of a checkpoint on token shards");
  commands[eval] = bottle::add_eval_command(*eval);
  CLI::App* prepare =
      app.add_subcommand("prepare", "text or JSONL -> llm.c token shards, with a tokenizer");
  commands[prepare] = bottle::add_prepare_command(*prepare);
  CLI::App* tokenize =
      app.add_subcommand("tokenize", "text -> token ids (JSON) with a tokenizer, or back");
  commands[tokenize] = bottle::add_tokenize_command(*tokenize);
  CLI::App* sample = app.add_subcommand("sample", "generate text from a model directory");
  commands[sample] = bottle::add_sample_command(*sample);
  CLI::App* export_ = app.add_subcommand(
      "export", "any checkpoint (sharded by a pipeline too) as one HF model directory");
  commands[export_] = bottle::add_export_command(*export_);
  CLI::App* lowrank = app.add_subcommand(
      "lowrank", "a full-rank model as an SVD or CoLA model, by truncated SVD of each projection");
  commands[lowrank] = bottle::add_lowrank_command(*lowrank);
  CLI::App* plan = app.add_subcommand(
      "plan", "predict step time and memory of every layout on a GPU cluster (--calibrate: here)");
  commands[plan] = bottle::add_plan_command(*plan);
  CLI::App* inspect = app.add_subcommand(
      "inspect", "what a checkpoint, a run's folder or prepared data holds (no weight loaded)");
  commands[inspect] = bottle::add_inspect_command(*inspect);
  CLI::App* plot =
      app.add_subcommand("plot", "draw loss and learning rate of metrics.jsonl files as a PNG");
  commands[plot] = bottle::add_plot_command(*plot);
  CLI::App* bench = app.add_subcommand("bench", "benchmarks");
  bench->require_subcommand(1);
  CLI::App* bench_step =
      bench->add_subcommand("step", "time forward + backward + AdamW, with the PyTorch peer");
  commands[bench_step] = bottle::add_bench_step_command(*bench_step);
  CLI::App* bench_tp = bench->add_subcommand(
      "tp", "full-rank, vanilla and bottleneck-aware TP side by side (under mpirun)");
  commands[bench_tp] = bottle::add_bench_tp_command(*bench_tp);
  CLI::App* bench_norm = bench->add_subcommand(
      "norm", "online RMSNorm over TP ranks against RMSNorm on one rank (under mpirun)");
  commands[bench_norm] = bottle::add_bench_norm_command(*bench_norm);
  CLI::App* bench_paper = bench->add_subcommand(
      "paper", "every comparison of the BOOST paper on this machine, as a report with plots");
  commands[bench_paper] = bottle::add_bench_paper_command(*bench_paper);
  CLI::App* bench_pipeline = bench->add_subcommand(
      "pipeline", "pipeline bubble per schedule and DP gradient traffic (under mpirun)");
  commands[bench_pipeline] = bottle::add_bench_pipeline_command(*bench_pipeline);
  CLI::App* bench_tokenize = bench->add_subcommand(
      "tokenize",
      "encoding MB/s of a tokenizer on 1 and more threads, with the HF tokenizers peer");
  commands[bench_tokenize] = bottle::add_bench_tokenize_command(*bench_tokenize);
  // A misspelt command would otherwise read "A subcommand is required": name it, and the
  // command it most likely meant.
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands({})) names.push_back(sub->get_name());
  if (argc > 1 && argv[1][0] != '-' &&
      std::find(names.begin(), names.end(), std::string(argv[1])) == names.end()) {
    fmt::print(stderr, "bottle: error: unknown command '{}'{} (commands: {}; see --help)\n",
               argv[1], bottle::did_you_mean(argv[1], names),
               fmt::format("{}", fmt::join(names, ", ")));
    return 1;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and the like: CLI11's own output. A bad command line is an error like any other
    // the user can cause: one sentence naming the option, exit status 1.
    if (e.get_exit_code() == 0) return app.exit(e);
    fmt::print(stderr, "bottle: error: {} (see --help)\n", e.what());
    return 1;
  }
  // A launcher runs mpirun itself, and the text tools (prepare, tokenize, bench tokenize,
  // inspect) are one process's work on files: none joins an MPI job (nor pays for starting
  // one).
  const bool launcher = bench_paper->parsed();
  const bool text_tool =
      prepare->parsed() || tokenize->parsed() || bench_tokenize->parsed() || inspect->parsed();
  auto report = [&](const char* kind, const char* message) {
    if (launcher || text_tool)
      fmt::print(stderr, "bottle: {}: {}\n", kind, message);
    else
      bottle::report_fatal_error(kind, message);
  };
  try {
    // Every rank joins the job before any check, so that an error found by all of them
    // (a bad configuration) is printed by all of them before the job ends.
    if (!launcher && !text_tool) bottle::world_communicator();
    check_openmp_threads();
    // train reads them on a thread of its own while they stay blocked (a Ctrl-C before that
    // waits for it, and stops the run before its first step); every other command takes them
    // as they come, with their default action.
    if (!train->parsed()) bottle::unblock_stop_signals();
    // Two ranks of a text tool would write the same files at once.
    if (text_tool)
      if (const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE");
          ranks && std::string(ranks) != "1")
        bottle::fail("{} runs as one process; run it without mpirun (the job has {} ranks)",
                     bench_tokenize->parsed() ? std::string("bench tokenize")
                                              : app.get_subcommands().front()->get_name(),
                     ranks);
    // Test failpoints: BOTTLE_FAILPOINT=bad_alloc fails an allocation on every rank, as the
    // machine's limit would after the plans let a run start; =internal_error breaks an
    // invariant, as a bug would (they test the handlers below).
    if (const char* spec = std::getenv("BOTTLE_FAILPOINT")) {
      if (std::string(spec) == "bad_alloc") throw std::bad_alloc();
      BOTTLE_ASSERT(std::string(spec) != "internal_error", "BOTTLE_FAILPOINT={}", spec);
    }
    for (auto& [sub, run] : commands)
      if (sub->parsed()) return run();
  } catch (const bottle::SettingError& e) {
    // A setting found wrong below src/train: named by its configuration key.
    report("error", bottle::describe_setting_error(e).c_str());
    return 1;
  } catch (const bottle::InternalError& e) {
    // A broken invariant (BOTTLE_ASSERT): a bug, reported with where it was found.
    report("internal error", fmt::format("at {}: {}", e.where(), e.message()).c_str());
    return 2;
  } catch (const bottle::Error& e) {
    report("error", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    // The plans refuse what will not fit; a failed allocation left is the machine's limit,
    // not a bug: the user can act on it.
    // ulimit -v caps the address space below what the machine has: then it is the limit.
    report("error", out_of_memory_message().c_str());
    return 1;
  } catch (const std::exception& e) {
    report("internal error", e.what());
    return 2;
  }
  return 0;
}
