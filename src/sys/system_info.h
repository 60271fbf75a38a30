#pragma once
// What a bug report or a benchmark figure needs to say about the machine: the CPU, its
// instruction sets, what bottle was compiled for and what oneDNN dispatches to. Figures that
// depend on the CPU are printed next to these.
#include <string>
#include <vector>

namespace bottle {

// /proc/cpuinfo's "model name" (or "unknown").
std::string cpu_model();
// The CPU's vector instruction sets that matter here, from its flags, best last
// (e.g. {"sse4_2", "avx", "avx2", "fma"}).
std::vector<std::string> cpu_vector_isa();
// The instruction sets this binary was compiled to assume (-march), e.g. "x86-64 + avx2,fma".
std::string compiled_isa();
// The instruction set oneDNN's kernels dispatch to on this CPU, e.g. "avx2" or
// "avx512_core_amx".
std::string onednn_isa();
// One line: "AMD EPYC (avx2, fma), oneDNN avx2".
std::string cpu_summary();

// Whether a launcher started this process as a rank of a job: mpirun (Open MPI) and MPICH's
// set the job's size in OMPI_COMM_WORLD_SIZE / PMI_SIZE, which a process started alone never
// has (PMIX_RANK, set in both, would not tell). Under one, stdout is the launcher's (a
// pseudo-terminal for Open MPI), and a Ctrl-C ends the job a few seconds after it is forwarded.
bool launched_by_mpirun();

}  // namespace bottle
