#!/usr/bin/env bash
# Fails (exit 1, one "file:line: what" per finding) when the lab reaches into the product
# (docs/design.md §2, issue 46): a product layer that includes src/bench or src/apps, src/bench
# including src/apps, or a bench-only hook back in a product layer. Benches time a layout's
# parts through the profiling backend and its ranges (TpLayout::components) and its
# collectives through the communicator's per-site counters, never through timers of their own
# inside the layers.
#   tools/check_bench_hooks.sh [ROOT]        check ROOT/src (default: this repository)
#   tools/check_bench_hooks.sh --self-test   also prove it catches a planted hook
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

product=(core sys io backend comm nn parallel pipeline model data train plan)

# Each a pattern and what it means, for the product's layers.
product_patterns=(
  '#[[:space:]]*include[[:space:]]*"(bench|apps)/'
  '\b(ComponentTimer|ComponentTimes|component_times)\b'
  '\b(compare_online_rmsnorm|OnlineNormProblem|online_rmsnorm_check)\b'
  # TensorParallel's old timing field: bench tp set it to time the groups.
  '\btp\.times\b'
)

check() {
  local root=$1 found=0 layer pattern line
  for layer in "${product[@]}"; do
    [ -d "$root/src/$layer" ] || continue
    for pattern in "${product_patterns[@]}"; do
      # Comment lines may name what was removed and why; only code counts.
      while IFS= read -r line; do
        echo "${line#"$root"/}"
        found=1
      done < <(grep -rnE --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' \
                 "$pattern" "$root/src/$layer" | grep -vE '^[^:]+:[0-9]+:[[:space:]]*//' || true)
    done
  done
  # The lab sits below the command line: it never includes the apps.
  while IFS= read -r line; do
    echo "${line#"$root"/}"
    found=1
  done < <(grep -rnE '#[[:space:]]*include[[:space:]]*"apps/' "$root/src/bench" 2>/dev/null || true)
  if [ "$found" = 1 ]; then
    echo "check_bench_hooks: the lab reaches into the product; time a part through the profiling" \
      "backend's ranges (Backend::push_range, TpLayout::components), and keep bench code in" \
      "src/bench" >&2
    return 1
  fi
}

if [ "${1:-}" = --self-test ]; then
  # shellcheck source=tools/lib/planted_self_test.sh
  source "$here/tools/lib/planted_self_test.sh"
  planted_self_test check_bench_hooks '#include "bench/paper_report.h"  // planted' "hook"
fi
check "${1:-$here}"
echo "check_bench_hooks: ok"
