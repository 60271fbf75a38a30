#!/usr/bin/env bash
# `bottle plan` on this machine, against what it predicts: calibrate (GEMM rates, memory
# bandwidth, attention, MPI's all-reduce between two ranks), then time bench tp's three modes
# at TP 1 and TP 2 and predict the same steps from the calibrated cluster file, side by side
# with the error of each (the target is ±20 %). A rank is one core here: TP 1 runs one rank of
# one thread, TP 2 two ranks of one thread each, as the calibration measured them.
#
#   scripts/plan_check.sh [CONFIG] [STEPS]      (default configs/bench_tp_1b.toml, 3 steps)
#
# Writes its files to $OUT when set, else plan-check/. Exit status 1 when a prediction misses
# by more than 20 %.
set -euo pipefail
cd "$(dirname "$0")/.."
config=${1:-configs/bench_tp_1b.toml}
steps=${2:-3}
out=${OUT:-plan-check}
bottle=${BOTTLE:-build/bottle}
mkdir -p "$out"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpi=(mpirun --oversubscribe)
[ "$(id -u)" -eq 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

"${mpi[@]}" -np 2 "$bottle" plan --calibrate "$out/cluster.toml" > "$out/calibrate.log"
echo "calibrated: $out/cluster.toml ($(grep '^name = ' "$out/cluster.toml" | head -2 | tail -1))"
status=0
printf '%-8s %-4s %12s %12s %8s\n' mode tp "measured ms" "predicted ms" error
for tp in 1 2; do
  # Only the JSON lines: mpirun may print its own.
  "${mpi[@]}" -np "$tp" "$bottle" bench tp "$config" --set parallel.tp="$tp" --threads 1 \
    --json --steps "$steps" --warmup 1 | grep '^{' > "$out/bench_tp$tp.json"
  # In the precision bench tp ran in (the configuration's), not the calibrated machine's
  # native one that plan would take unless told.
  precision=$(grep -E '^precision *=' "$config" | head -1 | sed -E 's/.*"(.*)".*/\1/')
  "$bottle" plan "$config" --cluster "$out/cluster.toml" --tp "$tp" --gpus "$tp" --json \
    --set training.precision="${precision:-fp32}" | grep '^{' > "$out/plan_tp$tp.json"
  # bench tp runs the configuration's micro-batch once: the planned row of one micro-batch.
  micro_batch=$(jq -s '[.[] | select(has("step_s") and .micro_batches == 1)]
                       | map(.micro_batch_size) | max // empty' "$out/plan_tp$tp.json")
  for mode in full vanilla btp; do
    measured=$(jq -r --arg m "$mode" 'select(.mode == $m and .recompute == "none") | .iter_ms' \
      "$out/bench_tp$tp.json")
    [ -n "$measured" ] || continue
    predicted=$(jq -r --arg m "$mode" --argjson b "${micro_batch:-0}" \
      'select(has("step_s") and .tp_mode == $m and .recompute == "none"
              and .micro_batch_size == $b and .micro_batches == 1) | .step_s * 1000' \
      "$out/plan_tp$tp.json")
    if [ -z "$predicted" ]; then
      printf '%-8s %-4s %12.1f %12s\n' "$mode" "$tp" "$measured" "not planned"
      status=1
      continue
    fi
    error=$(jq -n --argjson p "$predicted" --argjson m "$measured" '100 * ($p / $m - 1)')
    printf '%-8s %-4s %12.1f %12.1f %+7.1f%%\n' "$mode" "$tp" "$measured" "$predicted" "$error"
    jq -n -e --argjson e "$error" '$e | fabs <= 20' > /dev/null || status=1
  done
done
[ $status -eq 0 ] && echo "every prediction within ±20 %" || echo "a prediction missed by more than 20 %"
exit $status
