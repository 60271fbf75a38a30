#!/usr/bin/env bash
# tools/cluster/bench_emulated.sh: bench tp's three TP modes on an emulated GPU cluster (a
# preset dilated in time onto tools/cluster/cluster.sh, tools/cluster/emulate.sh) beside what
# `bottle plan` predicts for the same runs from the emulated cluster file, end to end (issue 43;
# docs/design.md §24). For each layout NxR (N nodes of R ranks, TP N·R):
# up, emulate (calibrate unshaped, shape the preset's links dilated by k, measure them, write
# the cluster file), `bench tp` (full, vanilla, btp side by side in one run, one thread per
# rank), the links measured again (emulate.sh --remeasure after), down, `bottle plan --cluster
# emulated.toml --tp T --gpus T --json` (and with emulated-after.toml), and a table:
# measured and predicted iteration (and communication) per mode with the error, btp's speedups
# over vanilla and over full-rank TP measured vs predicted, and the paper's.
#
#   tools/cluster/bench_emulated.sh [--preset a100-perlmutter] [--precision fp32]
#       [--config configs/bench_tp_1b.toml] [--set KEY=VALUE]... [--layouts "1x2 2x2"]
#       [--steps 3] [--warmup 1] [--repeats 1] [--out DIR]
#
# Default --set: training.seq_len=128. Files under DIR (default emulated-bench/): per layout
# and repeat the emulation (raw.toml, emulated.toml, emulate.env, probes), bench.json and
# plan.json; table.txt is what it prints. Exit status 1 when a prediction misses its target
# (±15 % of an iteration, ±10 % of a speedup). Needs root (cluster.sh), mpicc, jq, build/bottle.
# shellcheck disable=SC2154 # the variables of the sourced emulate.env
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=$here/cluster.sh
bottle=${BOTTLE:-$root/build/bottle}
preset=a100-perlmutter precision=fp32 config=$root/configs/bench_tp_1b.toml
layouts="1x2 2x2" steps=3 warmup=1 repeats=1 out=emulated-bench sets=()
while (($#)); do
  case $1 in
    --preset) preset=$2; shift 2 ;;
    --precision) precision=$2; shift 2 ;;
    --config) config=$2; shift 2 ;;
    --set) sets+=("$2"); shift 2 ;;
    --layouts) layouts=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --repeats) repeats=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_emulated.sh: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done
((${#sets[@]})) || sets=(training.seq_len=128)
sets+=("training.precision=$precision")
set_args=()
for s in "${sets[@]}"; do set_args+=(--set "$s"); done
mkdir -p "$out"
out=$(cd "$out" && pwd)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

state=''
cleanup() {
  if [[ -n $state ]]; then
    "$cluster" down --state "$state" >&2 || true
    rm -rf "$state"
    state=''
  fi
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM
trap 'cleanup; exit 129' HUP

paper() { # KEY: the paper's value (first of a range) from reference/boost_paper.toml
  awk -v sec="[$1]" '/^\[/ { in_sec = ($1 == sec) }
    in_sec && ($1 == "value" || $1 == "range") { sub(/^[^=]*= */, ""); gsub(/[][]/, ""); print; exit }' \
    "$root/reference/boost_paper.toml"
}
status=0
table=$out/table.txt
: > "$table"
say() { printf "$@" | tee -a "$table"; }
say '# bench_emulated.sh: preset %s, %s, %s %s, steps %s (warmup %s); CPU: %s (family %s, model %s)\n' \
  "$preset" "$precision" "$(basename "$config")" "${sets[*]}" "$steps" "$warmup" \
  "$(lscpu | sed -n 's/^Model name: *//p')" "$(lscpu | sed -n 's/^CPU family: *//p')" \
  "$(lscpu | sed -n 's/^Model: *//p')"
for layout in $layouts; do
  nodes=${layout%x*} rpn=${layout#*x}
  tp=$((nodes * rpn))
  for ((rep = 1; rep <= repeats; rep++)); do
    dir=$out/${layout}_$rep
    mkdir -p "$dir"
    state=$(mktemp -d "${TMPDIR:-/tmp}/bemu.XXXXXX")
    "$here/emulate.sh" --preset "$preset" --nodes "$nodes" --ranks-per-node "$rpn" \
      --precision "$precision" --state "$state" --out "$dir" --bottle "$bottle" > /dev/null
    echo "bench_emulated.sh: $layout: bench tp at TP $tp on the shaped cluster" >&2
    "$cluster" run --state "$state" -- -np "$tp" -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
      "$bottle" bench tp "$config" --set parallel.tp="$tp" "${set_args[@]}" --threads 1 --json \
      --steps "$steps" --warmup "$warmup" 2> "$dir/bench.err" | grep '^{' > "$dir/bench.json"
    # The links again, right after the bench: on a shared machine they drift.
    "$here/emulate.sh" --preset "$preset" --nodes "$nodes" --ranks-per-node "$rpn" \
      --precision "$precision" --state "$state" --out "$dir" --bottle "$bottle" \
      --remeasure after > /dev/null
    cleanup
    for f in "" -after; do
      "$bottle" plan "$config" --cluster "$dir/emulated$f.toml" --tp "$tp" --gpus "$tp" --json \
        "${set_args[@]}" | grep '^{' > "$dir/plan$f.json"
    done
    # shellcheck disable=SC1091
    . "$dir/emulate.env"
    say '\n## %s nodes x %s ranks, TP %s, repeat %s: k = %.4g\n' "$nodes" "$rpn" "$tp" "$rep" "$k"
    say 'links       intended (preset/k, x k)      shaped             measured: all-reduce Mbit/s, one-way us, per-step us\n'
    say 'intra-node  %8.0f Mbit/s %8.0f us   %-18s %8.0f %8.0f %8.0f\n' "$intra_intended_mbit" \
      "$intra_intended_lat_us" "$intra_link" "$intra_measured_mbit" "$intra_measured_oneway_us" \
      "$intra_measured_alpha_us"
    say 'inter-node  %8.0f Mbit/s %8.0f us   %-18s %8.0f %8.0f %8.0f\n' "$inter_intended_mbit" \
      "$inter_intended_lat_us" "$inter_link" "$inter_measured_mbit" "$inter_measured_oneway_us" \
      "$inter_measured_alpha_us"
    say 'per call    NCCL base x k %.0f us (not emulated); measured MPI base %.0f us\n' \
      "$base_intended_us" "$base_measured_us"
    micro_batch=$(jq -s '[.[] | select(has("step_s") and .micro_batches == 1)]
                         | map(.micro_batch_size) | max // empty' "$dir/plan.json")
    say 'links measured after the bench: intra %.0f Mbit/s, %.0f us per step; inter %.0f Mbit/s, %.0f us; base %.0f us\n' \
      "$(. "$dir/emulate-after.env"; echo "$intra_measured_mbit")" \
      "$(. "$dir/emulate-after.env"; echo "$intra_measured_alpha_us")" \
      "$(. "$dir/emulate-after.env"; echo "$inter_measured_mbit")" \
      "$(. "$dir/emulate-after.env"; echo "$inter_measured_alpha_us")" \
      "$(. "$dir/emulate-after.env"; echo "$base_measured_us")"
    say '%-8s %12s %12s %8s   %10s %10s   %12s %8s\n' mode "measured ms" "predicted ms" error \
      "comm ms" "pred comm" "pred (after)" error
    declare -A meas=() pred=()
    for mode in full vanilla btp; do
      m=$(jq -r --arg m "$mode" 'select(.mode == $m and .variant == $m and .recompute == "none") | "\(.iter_ms) \(.comm_ms)"' \
        "$dir/bench.json" | head -1)
      p=$(jq -r --arg m "$mode" --argjson b "${micro_batch:-0}" \
        'select(has("step_s") and .tp_mode == $m and .recompute == "none"
                and .micro_batch_size == $b and .micro_batches == 1)
         | "\(.step_s * 1000) \(.tp_comm_s * 1000)"' "$dir/plan.json" | head -1)
      pa=$(jq -r --arg m "$mode" --argjson b "${micro_batch:-0}" \
        'select(has("step_s") and .tp_mode == $m and .recompute == "none"
                and .micro_batch_size == $b and .micro_batches == 1) | .step_s * 1000' \
        "$dir/plan-after.json" | head -1)
      if [[ -z $m || -z $p ]]; then
        say '%-8s %12s %12s\n' "$mode" "${m%% *}" "${p%% *}"
        status=1
        continue
      fi
      meas[$mode]=${m%% *} pred[$mode]=${p%% *}
      err=$(awk -v p="${p%% *}" -v m="${m%% *}" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
      erra=$(awk -v p="${pa:-0}" -v m="${m%% *}" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
      say '%-8s %12.1f %12.1f %+7.1f%%   %10.1f %10.1f   %12.1f %+7.1f%%\n' "$mode" "${m%% *}" \
        "${p%% *}" "$err" "${m##* }" "${p##* }" "${pa:-0}" "$erra"
      awk -v e="$err" 'BEGIN { exit !(e < -15 || e > 15) }' && status=1
    done
    if [[ -n ${meas[btp]:-} && -n ${meas[vanilla]:-} && -n ${meas[full]:-} ]]; then
      say '%-18s %9s %9s %8s   %s\n' speedup measured predicted error "paper (7B, TP 4; range)"
      for over in vanilla full; do
        mr=$(awk -v a="${meas[$over]}" -v b="${meas[btp]}" 'BEGIN { printf "%.3f", a / b }')
        pr=$(awk -v a="${pred[$over]}" -v b="${pred[btp]}" 'BEGIN { printf "%.3f", a / b }')
        err=$(awk -v p="$pr" -v m="$mr" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
        say '%-18s %9s %9s %+7.1f%%   %s (%s)\n' "btp over $over" "$mr" "$pr" "$err" \
          "$(paper "iteration.boost_speedup_over_${over}_7b")" \
          "$(paper "iteration.boost_speedup_over_${over}_range" | tr -d ' ' | tr , -)"
        awk -v e="$err" 'BEGIN { exit !(e < -10 || e > 10) }' && status=1
      done
    fi
    unset meas pred
  done
done
if ((status == 0)); then say '\nevery prediction within its target (±15 %% iteration, ±10 %% speedup)\n'
else say '\na prediction missed its target (±15 %% iteration, ±10 %% speedup), or a row is missing\n'; fi
exit $status
