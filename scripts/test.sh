#!/usr/bin/env bash
# From a fresh Debian 12 machine: install, build, run the whole test suite.
#   --sanitize: the same suite built with ASan + UBSan in build-sanitize/; any report fails it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
if [ "${1:-}" != "--sanitize" ]; then
  scripts/build.sh
  ctest --test-dir build --output-on-failure
  exit 0
fi
cmake -S . -B build-sanitize -DCMAKE_BUILD_TYPE=Release -DBOTTLE_SANITIZE=ON >/dev/null
cmake --build build-sanitize -j"$(nproc)"
# Every process the tests start (bottle, mpirun's ranks) inherits these. A report aborts the
# process, so that it cannot pass as the exit status 1 that a bad-input test expects. Python
# (the PyTorch peer) is not instrumented and needs no preloaded runtime.
export ASAN_OPTIONS=abort_on_error=1:detect_leaks=1:strict_string_checks=1
export UBSAN_OPTIONS=halt_on_error=1:abort_on_error=1:print_stacktrace=1
export LSAN_OPTIONS=suppressions=$PWD/tools/sanitizers/lsan.supp:print_suppressions=0
ctest --test-dir build-sanitize --output-on-failure
