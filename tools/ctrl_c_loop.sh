#!/usr/bin/env bash
# Issue 29's Ctrl-C loop, as the issue ran it: RUNS runs of its command, each sent one SIGINT to
# its process group (as a terminal's Ctrl-C) at a random moment 1.5-9 s after the start; counts
# the exit statuses and keeps the folder of every run that did not exit 0 or say how it ended.
# Not a test (it takes minutes); the signals suite has the bounded version. Before the stop
# signals were read on a watcher thread (src/sys/stop_signals.h) about 1 run in 20 crashed.
#   tools/ctrl_c_loop.sh [BOTTLE] [RUNS] [SEED]
set -uo pipefail
cd "$(dirname "$0")/.."
bottle=${1:-build/bottle} runs=${2:-40} seed=${3:-1}
[ -d data/fortunes ] || {
  corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
  # shellcheck disable=SC2086
  "$bottle" prepare --input $corpus --output data/fortunes >/dev/null
}
declare -A statuses
RANDOM=$seed
for ((i = 1; i <= runs; i++)); do
  dir=$(mktemp -d)
  delay=$(awk -v r=$RANDOM 'BEGIN { printf "%.2f", 1.5 + 7.5 * r / 32767 }')
  setsid "$bottle" train configs/tiny.toml --set training.steps=300 --set training.eval_batches=3 \
    --set checkpoint.interval=100 --set metrics.log_freq=25 --set "checkpoint.folder=$dir/run" \
    >"$dir/out.log" 2>&1 &
  pid=$!
  sleep "$delay"
  kill -INT -- -"$pid" 2>/dev/null
  wait "$pid"
  status=$?
  statuses[$status]=$((${statuses[$status]:-0} + 1))
  if [ "$status" != 0 ] || ! grep -q "stopped by signal 2\|done: 300" "$dir/out.log"; then
    echo "run $i (SIGINT after $delay s): exit $status; kept $dir"
    grep -v '^step ' "$dir/out.log" | head -8
  else
    rm -rf "$dir"
  fi
done
for s in "${!statuses[@]}"; do echo "exit $s: ${statuses[$s]} of $runs runs"; done
