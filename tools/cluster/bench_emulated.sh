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
#       [--tp-overlap]
#       [--trains "2x2x1 2x1x2"] [--paper "3B 7B 13B"] [--paper-scale 4] [--paper-layers 4]
#       [--steps 3] [--warmup 1] [--repeats 1] [--out DIR]
#
# --tp-overlap: bench tp also times each mode with parallel.tp_overlap, in the same run, and
# `bottle plan --set parallel.tp_overlap=true` predicts those (plan-overlap.json): a second
# table per layout, overlapped iteration measured vs predicted, the hidden communication measured
# and predicted, what overlapping costs as predicted (tp_contention_s: the kernels' loss beside
# the calls and the started calls' own slowdown, from the emulated file's [overlap]) and the
# overlap's speedup.
#
# --trains TPxPPxDP...: 3D layouts too, each on nodes of TP ranks (TP within a node, the
# pipeline's stage boundary or the DP all-reduce across the inter-node link): `bottle train`
# of the same model for warmup + steps steps per mode (full, vanilla, btp) on a byte corpus
# made here, 4 micro-batches per step over all DP replicas (grad_accum_steps = 4 / DP), the
# median of metrics.jsonl's per-step ms after the warmup, beside `bottle plan --tp TP --pp PP
# --gpus TP·PP·DP --global-batch 4·micro_batch_size` (its row of that micro-batch size and
# count, 1F1B), the prediction's parts, and beside them what each group's collectives took in
# the run (metrics.jsonl's "comm", rank 0, the median over the steps: the calls' own time and
# the part the step waited for). Default: none ("" skips them; --layouts "" skips bench tp).
#
# --paper MODELS: the paper's iteration-time rows (`bottle plan --paper --json`'s models and
# layouts: 3B at TP 2, 7B at TP 4 in one node of four GPUs, 13B at TP 4 x PP 2 over two nodes),
# each model scaled down on this machine: hidden, FFN and head count ÷ --paper-scale (the
# heads rounded up to a multiple of TP that divides the hidden size), r = hidden / 4, the
# paper's layouts, --paper-layers blocks (a multiple of PP), a byte vocabulary, micro-batch 4.
# TP rows run bench tp on one node, PP rows bottle train as --trains does. Each row's DIR is
# paper_MODEL_REPEAT, which `bottle bench paper --emulated DIR` reads (result.json). 1B runs
# on one GPU: no link to emulate, so it is not a row here.
#
# Default --set: training.seq_len=128. Files under DIR (default emulated-bench/): per layout
# and repeat the emulation (raw.toml, emulated.toml, emulate.env, probes), bench.json and
# plan.json, and result.json (the measured and predicted milliseconds per mode, k, the
# layout); table.txt is what it prints. DIR is a new or empty directory, or one of an earlier
# run (.made-by-bench_emulated): one with other files is refused, as its names would be
# replaced. Exit status 1 when a prediction misses its target (±15 % of an iteration, ±10 % of
# a speedup); 2, before anything runs, for an argument it cannot use or nothing to measure
# (--layouts '' with no --trains and no --paper row). Needs root (cluster.sh), mpicc, jq,
# build/bottle.
# shellcheck disable=SC2154 # the variables of the sourced emulate.env
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=$here/cluster.sh
bottle=${BOTTLE:-$root/build/bottle}
preset=a100-perlmutter precision=fp32 config=$root/configs/bench_tp_1b.toml
layouts="1x2 2x2" trains='' tp_overlap='' steps=3 warmup=1 repeats=1 out=emulated-bench sets=()
paper_models='' paper_scale=4 paper_layers=4
die() { echo "bench_emulated.sh: $*" >&2; exit 2; }
# need_value, whole, one_of, key_value, input_file, preset, check_out_dir, make_out_dir.
# shellcheck source-path=SCRIPTDIR source=args.sh
. "$here/args.sh"
while (($#)); do
  case $1 in
    --tp-overlap) tp_overlap=--tp-overlap; shift; continue ;;
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --preset | --precision | --config | --set | --layouts | --trains | --paper | --paper-scale | \
      --paper-layers | --steps | --warmup | --repeats | --out) need_value "$@" ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
  case $1 in
    --preset) preset=$2 ;;
    --precision) precision=$2 ;;
    --config) config=$2 ;;
    --set) key_value --set "$2"; sets+=("$2") ;;
    --layouts) layouts=$2 ;;
    --trains) trains=$2 ;;
    --paper) paper_models=$2 ;;
    --paper-scale) paper_scale=$2 ;;
    --paper-layers) paper_layers=$2 ;;
    --steps) steps=$2 ;;
    --warmup) warmup=$2 ;;
    --repeats) repeats=$2 ;;
    --out) out=$2 ;;
  esac
  shift 2
done
# Every argument is checked before anything runs: a bad one would otherwise end a run of
# minutes as what it became (an unbound variable, a division by 0), or, where it leaves nothing
# to run, print that every prediction is within its target.
one_of --precision "$precision" fp32 bf16
# A layout runs on NODES emulated nodes of RANKS each: as many as cluster.sh makes, and two
# ranks at least, as emulate.sh calibrates with an all-reduce.
fits() { # NODES RANKS
  (($1 >= 1 && $1 <= max_nodes && $2 >= 1 && $2 <= max_ranks && $1 * $2 >= 2))
}
for layout in $layouts; do # NxR: bench tp at TP N·R on N nodes of R ranks
  if ! [[ $layout =~ ^([1-9][0-9]{0,2})x([1-9][0-9]{0,2})$ ]] ||
    ! fits "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"; then
    die "--layouts '$layout': give NxR layouts, N nodes of R ranks (N 1 to $max_nodes, R 1 to $max_ranks, 2 ranks at least; e.g. \"1x2 2x2\")"
  fi
done
for layout in $trains; do # TPxPPxDP: bottle train on PP·DP nodes of TP ranks, DP dividing 4 micro-batches
  if ! [[ $layout =~ ^([1-9][0-9]{0,2})x([1-9][0-9]{0,2})x([124])$ ]] ||
    ! fits $((BASH_REMATCH[2] * BASH_REMATCH[3])) "${BASH_REMATCH[1]}"; then
    die "--trains '$layout': give TPxPPxDP layouts, DP 1, 2 or 4 (PP·DP nodes of TP ranks: at most $max_nodes nodes of $max_ranks, 2 ranks at least; e.g. \"2x2x1 2x1x2\")"
  fi
done
[[ -n ${layouts//[[:space:]]/} || -n ${trains//[[:space:]]/} || -n ${paper_models//[[:space:]]/} ]] ||
  die "nothing to measure: --layouts is empty, and no --trains or --paper is given"
whole steps --steps 1
whole warmup --warmup 0
whole repeats --repeats 1
whole paper_scale --paper-scale 1
whole paper_layers --paper-layers 1
# The preset is only checked here: emulate.sh finds its file again from the name.
# shellcheck disable=SC2034 # set by preset, not read
preset_file=$preset
preset preset_file --preset "$precision"
input_file --config "$config"
command -v jq >/dev/null || die "no jq (it reads bottle's JSON lines; Debian package jq)"
[[ -f $bottle && -x $bottle ]] || die "no bottle binary at $bottle (build it, or set BOTTLE)"
# The paper's models (see --paper): each a row of bottle plan --paper, scaled down to a shape
# that bottle can build; one of one GPU (1B) has no link to emulate and is no row.
paper_json='' paper_rows=0
[[ -z ${paper_models//[[:space:]]/} ]] || paper_json=$("$bottle" plan --paper --json)
# paper_shape MODEL: sets p_row (its row of bottle plan --paper --json's iteration table),
# p_tp, p_pp and the scaled-down p_hidden, p_ffn, p_heads, or dies naming the option.
paper_shape() {
  local hidden ffn heads
  p_row=$(jq -c --arg m "$1" '.iteration[] | select(.model == $m)' <<< "$paper_json")
  [[ -n $p_row ]] ||
    die "--paper '$1': no such model in bottle plan --paper (its models: $(jq -r '[.iteration[].model] | join(" ")' <<< "$paper_json"))"
  read -r hidden ffn heads p_tp p_pp < <(jq -r '"\(.hidden) \(.ffn) \(.heads) \(.tp) \(.pp)"' <<< "$p_row")
  ((paper_layers % p_pp == 0)) || die "--paper-layers $paper_layers is not a multiple of $1's PP $p_pp"
  p_hidden=$((hidden / paper_scale))
  p_ffn=$(((ffn / paper_scale + 4) / 8 * 8)) # a multiple of 8, so that TP 2 and 4 divide it
  # The heads rounded up to a multiple of TP that divides the hidden size.
  p_heads=$(((heads / paper_scale + p_tp - 1) / p_tp * p_tp))
  ((p_heads >= p_tp)) || p_heads=$p_tp
  while ((p_heads <= p_hidden && p_hidden % p_heads)); do p_heads=$((p_heads + p_tp)); done
  ((p_hidden >= 4 && p_ffn > 0 && p_heads <= p_hidden)) ||
    die "--paper-scale $paper_scale: $1 (hidden $hidden, FFN $ffn) ÷ $paper_scale is too small to build (hidden 4 or more, FFN 8 or more, a multiple of TP $p_tp heads dividing the hidden size)"
}
for paper_model in $paper_models; do
  paper_shape "$paper_model"
  ((p_tp * p_pp < 2)) || paper_rows=$((paper_rows + 1))
done
[[ -n ${layouts//[[:space:]]/} || -n ${trains//[[:space:]]/} ]] || ((paper_rows)) ||
  die "nothing to measure: --layouts is empty, no --trains, and --paper '$paper_models' has no model of more than one GPU"
check_out_dir --out "$out" bench_emulated
((${#sets[@]})) || sets=(training.seq_len=128)
sets+=("training.precision=$precision")
set_args=()
for s in "${sets[@]}"; do set_args+=(--set "$s"); done
make_out_dir "$out" bench_emulated
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
paper_of_model() { # KEY MODEL: the paper's value of list KEY for MODEL (iteration.models' order)
  local models i
  models=$(awk -v sec="[iteration.models]" '/^\[/ { in_sec = ($1 == sec) }
    in_sec && $1 == "text" { sub(/^[^=]*= */, ""); gsub(/"/, ""); print; exit }' \
    "$root/reference/boost_paper.toml")
  i=$(awk -v m="$2" -v RS=' / ' '{ gsub(/\n/, "") } $0 == m { print NR; exit }' <<< "$models")
  paper "$1" | tr ',' '\n' | sed -n "${i:-0}p" | tr -d ' '
}
status=0
table=$out/table.txt
: > "$table"
say() { printf "$@" | tee -a "$table"; }
say '# bench_emulated.sh: preset %s, %s, %s %s, steps %s (warmup %s); CPU: %s (family %s, model %s)\n' \
  "$preset" "$precision" "$(basename "$config")" "${sets[*]}" "$steps" "$warmup" \
  "$(lscpu | sed -n 's/^Model name: *//p')" "$(lscpu | sed -n 's/^CPU family: *//p')" \
  "$(lscpu | sed -n 's/^Model: *//p')"
# DIR/result.json of one layout and repeat: the modes' measured and predicted milliseconds
# (meas, pred, after of the caller), k and the layout, for `bottle bench paper --emulated`.
write_result() { # DIR KIND LAYOUT TP PP DP CONFIG
  local modes='{}' mode
  for mode in full vanilla btp; do
    [[ -n ${meas[$mode]:-} ]] || continue
    modes=$(jq -c --arg m "$mode" --argjson ms "${meas[$mode]}" --argjson p "${pred[$mode]}" \
      --argjson a "${after[$mode]:-null}" \
      '. + {($m): {measured_ms: $ms, predicted_ms: $p, predicted_after_ms: $a}}' <<< "$modes")
  done
  jq -n --arg kind "$2" --arg layout "$3" --argjson tp "$4" --argjson pp "$5" --argjson dp "$6" \
    --arg config "$7" --argjson k "$k" --arg preset "$preset" --arg precision "$precision" \
    --arg model "${paper_model:-}" --argjson modes "$modes" \
    '{kind: $kind, layout: $layout, tp: $tp, pp: $pp, dp: $dp, config: $config, k: $k,
      preset: $preset, precision: $precision, paper_model: $model, modes: $modes}' > "$1/result.json"
}

# EXPR (jq) of bottle plan's row in FILE for MODE without recomputation, one micro-batch of
# MICRO_BATCH sequences: the row bench tp's run of that mode is compared with.
planned() { # FILE MODE MICRO_BATCH EXPR
  jq -r --arg m "$2" --argjson b "$3" 'select(has("step_s") and .tp_mode == $m
    and .recompute == "none" and .micro_batch_size == $b and .micro_batches == 1) | '"$4" \
    "$1" | head -1
}

# bench tp's three modes at TP N·R on an N x R emulated cluster, repeats times.
bench_tp_layout() { # LAYOUT(NxR) CONFIG NAME
  local layout=$1 cfg=$2 name=$3
  local nodes=${layout%x*} rpn=${layout#*x} tp rep dir micro_batch mode m p pa err erra mr pr over
  tp=$((nodes * rpn))
  for ((rep = 1; rep <= repeats; rep++)); do
    dir=$out/${name}_$rep
    mkdir -p "$dir"
    state=$(mktemp -d "${TMPDIR:-/tmp}/bemu.XXXXXX")
    "$here/emulate.sh" --preset "$preset" --nodes "$nodes" --ranks-per-node "$rpn" \
      --precision "$precision" --state "$state" --out "$dir" --bottle "$bottle" > /dev/null
    echo "bench_emulated.sh: $layout: bench tp at TP $tp on the shaped cluster" >&2
    "$cluster" run --state "$state" -- -np "$tp" -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
      "$bottle" bench tp "$cfg" --set parallel.tp="$tp" "${set_args[@]}" --threads 1 --json \
      --steps "$steps" --warmup "$warmup" ${tp_overlap:+"$tp_overlap"} 2> "$dir/bench.err" |
      grep '^{' > "$dir/bench.json"
    # The links again, right after the bench: on a shared machine they drift.
    "$here/emulate.sh" --preset "$preset" --nodes "$nodes" --ranks-per-node "$rpn" \
      --precision "$precision" --state "$state" --out "$dir" --bottle "$bottle" \
      --remeasure after > /dev/null
    cleanup
    for f in "" -after; do
      "$bottle" plan "$cfg" --cluster "$dir/emulated$f.toml" --tp "$tp" --gpus "$tp" --json \
        "${set_args[@]}" | grep '^{' > "$dir/plan$f.json"
    done
    if [[ -n $tp_overlap ]]; then
      "$bottle" plan "$cfg" --cluster "$dir/emulated.toml" --tp "$tp" --gpus "$tp" --json \
        "${set_args[@]}" --set parallel.tp_overlap=true | grep '^{' > "$dir/plan-overlap.json"
    fi
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
    declare -A meas=() pred=() after=()
    for mode in full vanilla btp; do
      m=$(jq -r --arg m "$mode" 'select(.mode == $m and .variant == $m and .recompute == "none") | "\(.iter_ms) \(.comm_ms)"' \
        "$dir/bench.json" | head -1)
      p=$(planned "$dir/plan.json" "$mode" "${micro_batch:-0}" \
        '"\(.step_s * 1000) \(.tp_comm_s * 1000)"')
      pa=$(planned "$dir/plan-after.json" "$mode" "${micro_batch:-0}" '.step_s * 1000')
      if [[ -z $m || -z $p ]]; then
        say '%-8s %12s %12s\n' "$mode" "${m%% *}" "${p%% *}"
        status=1
        continue
      fi
      meas[$mode]=${m%% *} pred[$mode]=${p%% *} after[$mode]=${pa:-}
      err=$(awk -v p="${p%% *}" -v m="${m%% *}" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
      erra=$(awk -v p="${pa:-0}" -v m="${m%% *}" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
      say '%-8s %12.1f %12.1f %+7.1f%%   %10.1f %10.1f   %12.1f %+7.1f%%\n' "$mode" "${m%% *}" \
        "${p%% *}" "$err" "${m##* }" "${p##* }" "${pa:-0}" "$erra"
      awk -v e="$err" 'BEGIN { exit !(e < -15 || e > 15) }' && status=1
    done
    if [[ -n ${meas[btp]:-} && -n ${meas[vanilla]:-} && -n ${meas[full]:-} ]]; then
      say '%-18s %9s %9s %8s   %s\n' speedup measured predicted error \
        "paper (${paper_model:-7B, TP 4}; range)"
      for over in vanilla full; do
        mr=$(awk -v a="${meas[$over]}" -v b="${meas[btp]}" 'BEGIN { printf "%.3f", a / b }')
        pr=$(awk -v a="${pred[$over]}" -v b="${pred[btp]}" 'BEGIN { printf "%.3f", a / b }')
        err=$(awk -v p="$pr" -v m="$mr" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
        say '%-18s %9s %9s %+7.1f%%   %s (%s)\n' "btp over $over" "$mr" "$pr" "$err" \
          "$(paper_of_model "iteration.boost_speedup_over_${over}" "${paper_model:-7B}")" \
          "$(paper "iteration.boost_speedup_over_${over}_range" | tr -d ' ' | tr , -)"
        awk -v e="$err" 'BEGIN { exit !(e < -10 || e > 10) }' && status=1
      done
    fi
    [[ -n $tp_overlap ]] && overlap_table "$dir" "${micro_batch:-0}"
    write_result "$dir" bench_tp "$layout" "$tp" 1 1 "$cfg"
    unset meas pred after
  done
}

# --tp-overlap's table of one layout: each mode's overlapped iteration measured (bench tp's
# tp-overlap variant) and predicted (plan-overlap.json), and the overlap's speedup (serial over
# overlapped iteration) measured and predicted. Uses meas and pred of the caller.
overlap_table() { # DIR MICRO_BATCH
  local mode m p p_step p_hidden p_contention err ms ps
  say '%-8s %12s %12s %8s   %10s %10s %10s   %9s %9s\n' overlap "measured ms" "predicted ms" error \
    "hidden ms" "pred hid." "pred cont." speedup predicted
  for mode in full vanilla btp; do
    m=$(jq -r --arg m "$mode" 'select(.mode == $m and .tp_overlap == true and .recompute == "none")
      | "\(.iter_ms) \(.comm_ms - .comm_exposed_ms)"' "$1/bench.json" | head -1)
    p=$(planned "$1/plan-overlap.json" "$mode" "$2" \
      '"\(.step_s * 1000) \(.tp_hidden_s * 1000) \((.tp_contention_s // 0) * 1000)"')
    if [[ -z $m || -z $p || -z ${meas[$mode]:-} ]]; then
      say '%-8s %12s %12s\n' "$mode" "${m%% *}" "${p%% *}"
      status=1
      continue
    fi
    err=$(awk -v p="${p%% *}" -v m="${m%% *}" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
    ms=$(awk -v s="${meas[$mode]}" -v o="${m%% *}" 'BEGIN { printf "%.3f", s / o }')
    ps=$(awk -v s="${pred[$mode]}" -v o="${p%% *}" 'BEGIN { printf "%.3f", s / o }')
    read -r p_step p_hidden p_contention <<< "$p"
    say '%-8s %12.1f %12.1f %+7.1f%%   %10.1f %10.1f %10.1f   %9s %9s\n' "$mode" "${m%% *}" \
      "$p_step" "$err" "${m##* }" "$p_hidden" "$p_contention" "$ms" "$ps"
    if awk -v e="$err" 'BEGIN { exit !(e < -15 || e > 15) }'; then status=1; fi
  done
}

# What each group's collectives took in a run's steps after the warm-up, as metrics.jsonl's
# "comm" (rank 0) has it: per group the median over the steps of the calls' own time and of
# the time the step waited for them, "tp 250/250, dp 1300/980" (ms).
measured_comm() { # METRICS
  jq -r --argjson w "$warmup" 'select(.step > $w) | .comm // {} | to_entries[] |
      "\(.key) \(.value.s * 1000) \(.value.exposed_s * 1000)"' "$1" 2>/dev/null |
    awk '
      { s[$1, ++n[$1]] = $2; e[$1, n[$1]] = $3; if (n[$1] == 1) order[++groups] = $1 }
      function median(a, g, k,   i, j, v, t) {
        for (i = 1; i <= k; ++i) v[i] = a[g, i]
        for (i = 2; i <= k; ++i)
          for (j = i; j > 1 && v[j - 1] > v[j]; --j) { t = v[j]; v[j] = v[j - 1]; v[j - 1] = t }
        return k % 2 ? v[(k + 1) / 2] : (v[k / 2] + v[k / 2 + 1]) / 2 }
      END { for (i = 1; i <= groups; ++i) { g = order[i]
              printf "%s%s %.0f/%.0f", (i > 1 ? ", " : ""), g, median(s, g, n[g]), median(e, g, n[g]) }
            if (!groups) printf "-" }'
}

# bottle train per mode at TP x PP x DP on PP·DP emulated nodes of TP ranks, repeats times.
train_layout() { # LAYOUT(TPxPPxDP) CONFIG NAME
  local layout=$1 cfg=$2 name=$3
  local tp pp dp ranks nodes accum rep dir micro_batch mode model m p pa err erra mr pr over query f
  IFS=x read -r tp pp dp <<< "$layout"
  ranks=$((tp * pp * dp)) nodes=$((pp * dp)) accum=$((4 / dp))
  for ((rep = 1; rep <= repeats; rep++)); do
    dir=$out/${name}_$rep
    mkdir -p "$dir"
    state=$(mktemp -d "${TMPDIR:-/tmp}/bemu.XXXXXX")
    "$here/emulate.sh" --preset "$preset" --nodes "$nodes" --ranks-per-node "$tp" \
      --precision "$precision" --state "$state" --out "$dir" --bottle "$bottle" > /dev/null
    for mode in full vanilla btp; do
      model=() && [[ $mode == full ]] && model=(--set model.bottleneck=none)
      echo "bench_emulated.sh: train $layout ($mode) on the shaped cluster" >&2
      rm -rf "$dir/run_$mode"
      "$cluster" run --state "$state" -- -np "$ranks" -x OMP_NUM_THREADS -x OMP_WAIT_POLICY \
        "$bottle" train "$cfg" "${set_args[@]}" "${model[@]}" --set parallel.tp_mode="$mode" \
        --set parallel.tp="$tp" --set parallel.pp="$pp" --set parallel.dp="$dp" \
        --set training.grad_accum_steps="$accum" --set training.steps=$((warmup + steps)) \
        --set training.eval_interval=0 --set checkpoint.interval=0 --set metrics.log_freq=1 \
        --set metrics.plot='' --set data.train="$out/data/data_train_*.bin" --set data.val='' \
        --set checkpoint.folder="$dir/run_$mode" > "$dir/train_$mode.log" 2>&1 || status=1
    done
    "$here/emulate.sh" --preset "$preset" --nodes "$nodes" --ranks-per-node "$tp" \
      --precision "$precision" --state "$state" --out "$dir" --bottle "$bottle" \
      --remeasure after > /dev/null
    cleanup
    micro_batch=$(sed -n 's/^micro_batch_size *= *//p' "$dir/run_btp/train_config.toml" 2>/dev/null | head -1)
    for f in "" -after; do
      "$bottle" plan "$cfg" --cluster "$dir/emulated$f.toml" --tp "$tp" --pp "$pp" \
        --gpus "$ranks" --global-batch $((4 * ${micro_batch:-1})) --json "${set_args[@]}" |
        grep '^{' > "$dir/plan$f.json"
    done
    # shellcheck disable=SC1091
    . "$dir/emulate.env"
    say '\n## train tp %s x pp %s x dp %s (%s nodes x %s ranks), 4 micro-batches of %s, repeat %s: k = %.4g\n' \
      "$tp" "$pp" "$dp" "$nodes" "$tp" "${micro_batch:-?}" "$rep" "$k"
    say 'links shaped: intra %s, inter %s; measured after: inter %.0f Mbit/s\n' "$intra_link" \
      "$inter_link" "$(. "$dir/emulate-after.env"; echo "$inter_measured_mbit")"
    say '%-8s %12s %12s %8s   %12s %8s   %-42s %s\n' mode "measured ms" "predicted ms" error \
      "pred (after)" error "predicted: compute, tp comm, bubble, p2p," "measured (rank 0): tp, pp, dp"
    say '%-8s %12s %12s %8s   %12s %8s   %-42s %s\n' "" "" "" "" "" "" "dp comm, optimizer (ms)" \
      "calls' time / waited for (ms)"
    declare -A meas=() pred=() after=()
    for mode in full vanilla btp; do
      m=$(sed -n 's/.*"ms":\([^,]*\),.*"step":\([0-9]*\),.*/\2 \1/p' "$dir/run_$mode/metrics.jsonl" 2>/dev/null |
        awk -v w="$warmup" '$1 > w { print $2 }' | sort -g |
        awk '{ v[NR] = $1 } END { if (NR) print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2) }')
      query='select(has("step_s") and .tp_mode == $m and .recompute == "none" and .dp == $dp
                    and .schedule == "1f1b" and .micro_batch_size == $b and .micro_batches == $n)'
      p=$(jq -r --arg m "$mode" --argjson b "${micro_batch:-0}" --argjson n "$accum" --argjson dp "$dp" \
        "$query"' | "\(.step_s * 1000) \(.compute_s * 1000) \(.tp_comm_s * 1000) \(.bubble_s * 1000) \(.p2p_s * 1000) \(.dp_comm_s * 1000) \(.optimizer_s * 1000)"' \
        "$dir/plan.json" | head -1)
      pa=$(jq -r --arg m "$mode" --argjson b "${micro_batch:-0}" --argjson n "$accum" --argjson dp "$dp" \
        "$query"' | .step_s * 1000' "$dir/plan-after.json" | head -1)
      if [[ -z $m || -z $p ]]; then
        say '%-8s %12s %12s   (see %s)\n' "$mode" "${m:-none}" "${p%% *}" "$dir/train_$mode.log"
        status=1
        continue
      fi
      meas[$mode]=$m pred[$mode]=${p%% *} after[$mode]=${pa:-}
      err=$(awk -v p="${p%% *}" -v m="$m" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
      erra=$(awk -v p="${pa:-0}" -v m="$m" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
      say '%-8s %12.1f %12.1f %+7.1f%%   %12.1f %+7.1f%%   %-42s %s\n' "$mode" "$m" "${p%% *}" "$err" \
        "${pa:-0}" "$erra" "$(awk '{ printf "%.0f, %.0f, %.0f, %.0f, %.0f, %.0f", $2, $3, $4, $5, $6, $7 }' <<< "$p")" \
        "$(measured_comm "$dir/run_$mode/metrics.jsonl")"
      awk -v e="$err" 'BEGIN { exit !(e < -15 || e > 15) }' && status=1
    done
    if [[ -n ${meas[btp]:-} && -n ${meas[vanilla]:-} && -n ${meas[full]:-} ]]; then
      say '%-18s %9s %9s %8s\n' speedup measured predicted error
      for over in vanilla full; do
        mr=$(awk -v a="${meas[$over]}" -v b="${meas[btp]}" 'BEGIN { printf "%.3f", a / b }')
        pr=$(awk -v a="${pred[$over]}" -v b="${pred[btp]}" 'BEGIN { printf "%.3f", a / b }')
        err=$(awk -v p="$pr" -v m="$mr" 'BEGIN { printf "%.1f", 100 * (p / m - 1) }')
        say '%-18s %9s %9s %+7.1f%%\n' "btp over $over" "$mr" "$pr" "$err"
        awk -v e="$err" 'BEGIN { exit !(e < -10 || e > 10) }' && status=1
      done
    fi
    write_result "$dir" train "$layout" "$tp" "$pp" "$dp" "$cfg"
    unset meas pred after
  done
}

# The byte corpus bottle train reads (made once).
make_corpus() {
  [[ -d $out/data ]] && return
  awk 'BEGIN { for (i = 1; i <= 20000; i++) printf "line %d: %d apples and %d pears\n", i, i * 7919 % 1000, i * 104729 % 977 }' \
    > "$out/corpus.txt"
  "$bottle" prepare --input "$out/corpus.txt" --output "$out/data" > /dev/null
}

# The paper's MODEL scaled down (see --paper), written to DIR/paper_MODEL.toml; prints its
# layout as TP PP.
paper_config() { # MODEL
  paper_shape "$1" # checked before the runs began
  cat > "$out/paper_$1.toml" << TOML
# The paper's $1 ($(jq -r .shape <<< "$p_row"); TP $p_tp, PP $p_pp), scaled down by bench_emulated.sh
# --paper-scale $paper_scale: hidden, FFN and heads ÷ $paper_scale, r = hidden / 4, $paper_layers blocks.
[model]
vocab_size = 256
hidden_size = $p_hidden
intermediate_size = $p_ffn
num_layers = $paper_layers
num_heads = $p_heads
bottleneck = "cola"
rank = $((p_hidden / 4))
max_seq_len = 1024

[training]
micro_batch_size = 4
seq_len = 256
seed = 1

[parallel]
grouping = true
TOML
  echo "$p_tp $p_pp"
}

for layout in $layouts; do bench_tp_layout "$layout" "$config" "$layout"; done
if [[ -n $trains ]]; then make_corpus; fi
for layout in $trains; do train_layout "$layout" "$config" "train_$layout"; done
for paper_model in $paper_models; do
  paper_layout=$(paper_config "$paper_model")
  read -r ptp ppp <<< "$paper_layout"
  if ((ppp > 1)); then
    make_corpus
    train_layout "${ptp}x${ppp}x1" "$out/paper_$paper_model.toml" "paper_$paper_model"
  elif ((ptp > 1)); then
    bench_tp_layout "1x$ptp" "$out/paper_$paper_model.toml" "paper_$paper_model"
  else
    say '\n## paper %s: one GPU, no link to emulate: not a row here\n' "$paper_model"
  fi
done
paper_model=''

if ((status == 0)); then say '\nevery prediction within its target (±15 %% iteration, ±10 %% speedup)\n'
else say '\na prediction missed its target (±15 %% iteration, ±10 %% speedup), or a row is missing\n'; fi
exit $status
