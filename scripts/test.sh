#!/usr/bin/env bash
# From a fresh Debian 12 machine: install, build, run the whole test suite.
#   --sanitize: the same suite built with ASan + UBSan in build-sanitize/; any report fails it.
#   --sanitize-quick: the same for the kernels, the hostile-input and CLI tests, the
#     communicator and stop signals (what CI runs: the whole suite under the sanitizers takes
#     far longer).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mode=${1:-}
if [ -z "$mode" ]; then
  scripts/build.sh
  ctest --test-dir build --output-on-failure
  exit 0
fi
[ "$mode" = --sanitize ] || [ "$mode" = --sanitize-quick ] || {
  echo "usage: scripts/test.sh [--sanitize | --sanitize-quick]" >&2
  exit 2
}
# The sanitizers instrument host code only: the CUDA sources stay out of this build. Portable
# (no -march=native): the main build covers this CPU's own instructions, this one the code
# any x86-64 runs.
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release -DBOTTLE_SANITIZE=ON -DBOTTLE_CUDA=OFF \
  -DBOTTLE_NATIVE=OFF >/dev/null
tests=()
if [ "$mode" = --sanitize-quick ]; then
  # The kernels: the op table (every op against the reference) and backend_ops; hostile
  # files, the CLI, the collectives, a failing rank, and stop signals at random moments.
  cmake --build build-sanitize -j"$(nproc)" --target bottle test_backend_ops test_device_ops \
    test_hostile_fuzz test_cli test_comm test_fatal_error fatal_error_probe test_signals
  tests=(-R '^(backend_ops|device_ops_cpu|hostile_fuzz|cli|comm_np2|fatal_error|signals)$')
else
  cmake --build build-sanitize -j"$(nproc)"
fi
# Every process the tests start (bottle, mpirun's ranks) inherits these. A report aborts the
# process, so that it cannot pass as the exit status 1 that a bad-input test expects. Python
# (the PyTorch peer) is not instrumented and needs no preloaded runtime.
# Open MPI keeps its components loaded (unloaded, their leaks have no module name to suppress)
# and malloc stacks are unwound fully (libc's frames have no frame pointers).
export OMPI_MCA_mca_base_component_disable_dlclose=1
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1:fast_unwind_on_malloc=0
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tools/sanitizers/lsan.supp:print_suppressions=0
ctest --test-dir build-sanitize --output-on-failure "${tests[@]}"
