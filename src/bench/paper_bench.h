#pragma once
// `bottle bench paper`: the BOOST paper's comparisons, scaled to this machine, in one report
// (bench/paper_report.h). A launcher: each measurement is another bottle command run under
// mpirun, whose rows it reads into bench/results.h's records.
#include <string>
#include <vector>

namespace bottle {

struct PaperBenchOptions {
  std::string out;           // the report's directory
  bool quick = false;        // small shapes and few steps
  std::string memory_limit;  // of the micro-batch sweep, per rank ("2GiB"); empty: the paper's
  std::vector<std::string> corpus;  // the loss curves' text; empty: Debian's license texts
  int max_ranks = 4;                // the largest TP degree
  std::string emulated;  // a folder of bench_emulated.sh --paper results to add; empty: none
};

// Runs every measurement and writes the report; refused under mpirun.
void run_bench_paper(PaperBenchOptions options);

}  // namespace bottle
