// `bottle bench paper`'s command line (bench/paper_bench.h runs it).
#include <memory>

#include "apps/cli_checks.h"
#include "apps/commands.h"
#include "bench/paper_bench.h"

namespace bottle {

Command add_bench_paper_command(CLI::App& app) {
  auto o = std::make_shared<PaperBenchOptions>();
  app.add_option("--out", o->out, "directory for report.md, the plots and the logs")
      ->required()
      ->check(output_directory());
  app.add_flag("--quick", o->quick, "small shapes and few steps (under 3 minutes on 2 cores)");
  app.add_option("--memory-limit", o->memory_limit,
                 "per-rank limit of the micro-batch sweep (default: the model state per rank "
                 "times the paper's proportion of GPU memory to CoLA-7B's model state per GPU)");
  app.add_option("--corpus", o->corpus,
                 "text files for the loss curves (default: /usr/share/common-licenses/*)");
  app.add_option("--max-ranks", o->max_ranks, "largest TP degree (2 or 4)")
      ->check(CLI::IsMember({2, 4}));
  app.add_option("--emulated", o->emulated,
                 "add the paper's iteration-time rows run on an emulated GPU cluster from the "
                 "result.json files of `tools/cluster/bench_emulated.sh --paper MODELS --out DIR`")
      ->check(CLI::ExistingDirectory);
  return [o] {
    run_bench_paper(*o);
    return 0;
  };
}

}  // namespace bottle
