#!/usr/bin/env bash
# Runs one fixed set of small CPU runs and commands with two bottle binaries and compares what
# they wrote, for a change that must not move a bit or a byte on the CPU backends:
#   tools/same_bits.sh OLD_BOTTLE NEW_BOTTLE [WORK_DIR]
# (e.g. build-old/bottle build/bottle; WORK_DIR keeps the runs, else a scratch folder is used
# and removed). Prints one line per check: "same", "DIFFERS" with the first difference, or
# "FAILED" for a run that should have succeeded (or crashed), and exits 1 on any but "same".
#   train   configs/tiny.toml shrunk to d 64 and 16 steps for none / svd / cola / lax in fp32
#           and bf16; cosine and linear decay after a 4-step warmup; TP 2 in each mode (btp, vanilla, full); LaX under btp with lowrank
#           recomputation, under vanilla with block recomputation and over a 2-stage pipeline;
#           a 2 × 2 pipeline × DP with ZeRO-1 in bf16 with accumulation; a run resumed halfway.
#           metrics.jsonl without its times, rates and memory, and every file of every
#           checkpoint byte for byte (trainer_state.json without the resolved configuration and
#           the times of the metrics lines it keeps).
#   bench   `bench tp` on 2 ranks, each mode and recompute policy: the communication volumes
#           (every *_elems_*, *_bytes_per_token_* and collectives key), not the times.
#   paper   `bench paper --quick`'s results.json, every figure but the timings (milliseconds,
#           seconds, rates, speedups, MFU, the date; the planner's predictions whole), and report.md with its numbers and the
#           words a timing chooses masked; opt in with SAME_BITS_PAPER=1 (about 3 minutes a
#           binary).
#   cli     byte for byte, with the exit status: `--help`, `train --help`, `train --help-config`,
#           configuration errors (an unknown key, values out of range, a bad choice, a bad
#           TOML file), `plan` on configs/llama7b_cola.toml for a cluster file, `bench tp --fit`.
# SAME_BITS_ONLY=REGEX runs only the checks whose names match (for a change that moves some
# bits on purpose: the others must still be the same).
set -euo pipefail
if [ $# -lt 2 ]; then
  echo "usage: tools/same_bits.sh OLD_BOTTLE NEW_BOTTLE [WORK_DIR]" >&2
  exit 2
fi
old=$(realpath "$1") new=$(realpath "$2")
for bin in "$old" "$new"; do
  [ -x "$bin" ] || { echo "same_bits: $bin is not an executable" >&2; exit 2; }
done
if [ -n "${3:-}" ]; then
  mkdir -p "$3"
  work=$(realpath "$3")
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
cd "$(dirname "$0")/.."
mkdir -p "$work/old" "$work/new" "$work/run"
# One passive OpenMP thread per rank unless told otherwise: ranks may outnumber cores.
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
if [ "$(id -u)" -eq 0 ]; then export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1; fi
mpi=(mpirun --oversubscribe -np)

corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
# shellcheck disable=SC2086
[ -f "$work/data/data_train.json" ] || "$new" prepare --input $corpus --output "$work/data" >/dev/null
shape=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_layers=4
  --set model.num_heads=4 --set model.rank=16 --set training.micro_batch_size=4
  --set training.seq_len=64)
common=("${shape[@]}" --set training.steps=16 --set training.eval_interval=8
  --set training.eval_batches=2 --set checkpoint.interval=8 --set checkpoint.keep=2
  --set metrics.log_freq=1 --set metrics.plot=
  --set "data.train=$work/data/data_train_*.bin" --set "data.val=$work/data/data_val_*.bin")

checks=0 failures=0
same() {  # same NAME [DETAIL]
  checks=$((checks + 1))
  echo "same     $1${2:+ ($2)}"
}
differs() {  # differs NAME WHAT
  checks=$((checks + 1)) failures=$((failures + 1))
  echo "DIFFERS  $1: $2"
}
failed() {  # failed NAME WHICH STATUS LOG: a run or command that should succeed did not
  checks=$((checks + 1)) failures=$((failures + 1))
  local line
  line=$(grep -m 1 -E 'error|Segmentation fault|Aborted' "$4" || tail -n 1 "$4")
  echo "FAILED   $1: $2 exited $3: ${line:0:200}"
}
selected() { [[ $1 =~ ${SAME_BITS_ONLY:-.} ]]; }
binary() { if [ "$1" = old ]; then echo "$old"; else echo "$new"; fi; }

# The first difference of two text files: the line, then each side's text (cut short).
text_difference() {
  { diff "$1" "$2" || true; } | awk '
    NR == 1 { where = $1; sub(/[^0-9].*/, "", where) }
    /^</ && o == "" { o = substr($0, 3, 160) }
    /^>/ && n == "" { n = substr($0, 3, 160) }
    END { printf "line %s: old %s | new %s", where, o == "" ? "(none)" : o, n == "" ? "(none)" : n }'
}
# The first difference of two binary files: their sizes, or the first byte that differs.
byte_difference() {
  local a b
  a=$(stat -c %s "$1") b=$(stat -c %s "$2")
  if [ "$a" != "$b" ]; then
    echo "$a bytes, new $b"
  else
    { cmp "$1" "$2" || true; } | sed -e 's/.* differ: //' -e 's/, line .*//'
  fi
}

# --- train: each binary into the same folder in turn (trainer_state.json records the folder),
# moved aside after.
train() {  # train NAME NP ARGS...
  local name=$1 np=$2
  shift 2
  selected "$name" || return 0
  local which launch=()
  [ "$np" = 1 ] || launch=("${mpi[@]}" "$np")
  for which in old new; do
    local dir="$work/run/$name"
    rm -rf "$dir" "${work:?}/$which/$name"
    local status=0
    ("${launch[@]}" "$(binary $which)" train configs/tiny.toml "${common[@]}" \
      --set "checkpoint.folder=$dir" "$@" || exit) >"$dir.log" 2>&1 || status=$?
    if [ $status != 0 ]; then
      failed "train $name" $which $status "$dir.log"
      return 0
    fi
    mv "$dir" "$work/$which/$name"
  done
  compare_runs "$name"
}

compare_runs() {  # compare_runs NAME: the two folders the binaries trained into
  local name=$1 a="$work/old/$1" b="$work/new/$1"
  # A metrics record without its times, rates and memory.
  local drop='del(.tokens_per_s, .mfu, .ms, .comm, .peak_bytes, .activation_bytes, .memory, .elapsed_s,
    .eta_s, .time, .seconds, .tokens_seen, .epoch)'
  # trainer_state.json without the resolved configuration, which gains every key a change
  # adds, and with the metrics lines it carries for a resume as metrics.jsonl's.
  local state="del(.config) | if has(\"metrics_lines\") then
    .metrics_lines |= map(fromjson | $drop | tojson) else . end"
  jq -c "$drop" "$a/metrics.jsonl" >"$a/metrics.cmp"
  jq -c "$drop" "$b/metrics.jsonl" >"$b/metrics.cmp"
  if ! cmp -s "$a/metrics.cmp" "$b/metrics.cmp"; then
    differs "train $name" "metrics.jsonl $(text_difference "$a/metrics.cmp" "$b/metrics.cmp")"
    return 0
  fi
  local files f
  files=$(cd "$a" && find . -path './step_*' -type f | sort)
  if [ "$files" != "$(cd "$b" && find . -path './step_*' -type f | sort)" ]; then
    differs "train $name" "the checkpoints hold other files: $(diff <(echo "$files") \
      <(cd "$b" && find . -path './step_*' -type f | sort) | grep '^[<>]' | head -n 1)"
    return 0
  fi
  [ -n "$files" ] || { differs "train $name" "no checkpoint files"; return 0; }
  for f in $files; do
    if [[ $f == */trainer_state.json ]]; then
      if ! cmp -s <(jq -S "$state" "$a/$f") <(jq -S "$state" "$b/$f"); then
        differs "train $name" "${f#./} $(text_difference <(jq -S "$state" "$a/$f") \
          <(jq -S "$state" "$b/$f"))"
        return 0
      fi
    elif ! cmp -s "$a/$f" "$b/$f"; then
      differs "train $name" "${f#./} at $(byte_difference "$a/$f" "$b/$f")"
      return 0
    fi
  done
  same "train $name" "$(wc -l <"$a/metrics.jsonl") metrics lines, $(echo "$files" | wc -l) checkpoint files"
}

# Resumed: 8 steps, then on to 16 from the step-8 checkpoint.
train_resumed() {
  selected resume || return 0
  local which
  for which in old new; do
    local dir="$work/run/resume"
    rm -rf "$dir" "${work:?}/$which/resume"
    local status=0
    ("$(binary $which)" train configs/tiny.toml "${common[@]}" --set "checkpoint.folder=$dir" \
      --set training.steps=8 && "$(binary $which)" train configs/tiny.toml "${common[@]}" \
      --set "checkpoint.folder=$dir" --resume || exit) >"$dir.log" 2>&1 || status=$?
    if [ $status != 0 ]; then
      failed "train resume" $which $status "$dir.log"
      return 0
    fi
    mv "$dir" "$work/$which/resume"
  done
  compare_runs resume
}

# --- bench tp: the volumes of each mode and policy, one JSON row each, keyed by variant.
bench_tp_volumes() {
  local name="bench tp volumes"
  selected "$name" || return 0
  local which out
  for which in old new; do
    out="$work/$which/bench_tp"
    local status=0
    ("${mpi[@]}" 2 "$(binary $which)" bench tp configs/tiny.toml "${shape[@]}" --steps 1 \
      --warmup 0 --threads 1 --json --recompute || exit) >"$out.log" 2>&1 || status=$?
    if [ $status != 0 ]; then
      failed "$name" $which $status "$out.log"
      return 0
    fi
    grep '^{' "$out.log" | jq -c -S 'with_entries(select(.key == "variant"
      or (.key | test("elems|bytes_per_token|collectives"))))' >"$out.cmp"
  done
  if [ ! -s "$work/old/bench_tp.cmp" ]; then
    differs "$name" "no JSON rows"
  elif cmp -s "$work/old/bench_tp.cmp" "$work/new/bench_tp.cmp"; then
    same "$name" "$(wc -l <"$work/old/bench_tp.cmp") variants"
  else
    differs "$name" "$(text_difference "$work/old/bench_tp.cmp" "$work/new/bench_tp.cmp")"
  fi
}

# --- paper: bench paper --quick's figures but its timings. Which lines of the report a
# timing decides ("higher" or "about the same") are masked with the numbers.
bench_paper() {
  local name="bench paper"
  [ "${SAME_BITS_PAPER:-0}" = 1 ] && selected "$name" || return 0
  local which out
  # bench step's peak_bytes counts the buffers its GEMM peak measurement sized by time. The
  # planner's predictions (.predicted) are no timings: they are compared whole.
  # shellcheck disable=SC2016 # $planned is jq's variable
  local untimed='.predicted as $planned | walk(if type == "object" then with_entries(select(.key |
    test("ms_per|_ms$|_ms_|^ms|_per_ms$|_per_s$|speedup|_s$|gflops|mfu|^date$") | not))
    else . end) | del(.torch[]?.peak_bytes) | .predicted = $planned'
  for which in old new; do
    out="$work/$which/paper"
    rm -rf "$out"
    local status=0
    ("$(binary $which)" bench paper --quick --out "$out" || exit) >"$out.log" 2>&1 || status=$?
    if [ $status != 0 ]; then
      failed "$name" $which $status "$out.log"
      return 0
    fi
    jq -S "$untimed" "$out/results.json" >"$out.cmp"
    sed -E 's/[-+]?[0-9][0-9.,]*(e[-+]?[0-9]+)?/N/g; s/higher|lower|about the same|faster|slower/W/g' \
      "$out/report.md" >"$out.report"
  done
  local a="$work/old/paper" b="$work/new/paper"
  if ! cmp -s "$a.cmp" "$b.cmp"; then
    differs "$name" "results.json $(text_difference "$a.cmp" "$b.cmp")"
  elif ! cmp -s "$a.report" "$b.report"; then
    differs "$name" "report.md $(text_difference "$a.report" "$b.report")"
  else
    same "$name" "$(jq '[paths(scalars)] | length' "$a.cmp") figures, $(wc -l <"$a.report") report lines"
  fi
}

# --- cli: stdout, stderr and the exit status, byte for byte. argv[0] is "bottle" for both,
# since the usage line names it.
cli() {  # cli NAME NP ARGS...
  local name="cli $1" np=$2
  shift 2
  selected "$name" || return 0
  local which out launch=()
  [ "$np" = 1 ] || launch=("${mpi[@]}" "$np")
  for which in old new; do
    out="$work/$which/cli_${name// /_}"
    local status=0
    if [ "$np" = 1 ]; then
      ( (exec -a bottle "$(binary $which)" "$@") >"$out.out" 2>"$out.err" || exit) 2>/dev/null ||
        status=$?
    else
      # The ranks' lines in a fixed order, without mpirun's own notices (framed by dashed
      # lines, naming job ids and pids).
      "${launch[@]}" "$(binary $which)" "$@" >"$out.out" 2>"$out.log" || status=$?
      awk '/^--------------------/ { framed = !framed; next } !framed' "$out.log" | sort >"$out.err"
    fi
    echo "$status" >"$out.status"
    # A crash is no behaviour to keep, even in both.
    if ((status >= 128)); then
      failed "$name" $which $status "$out.err"
      return 0
    fi
  done
  local a="$work/old/cli_${name// /_}" b="$work/new/cli_${name// /_}" part
  for part in status out err; do
    if ! cmp -s "$a.$part" "$b.$part"; then
      differs "$name" "$([ $part = status ] && echo "exit status" || echo "std$part") $(text_difference "$a.$part" "$b.$part")"
      return 0
    fi
  done
  same "$name" "exit $(cat "$a.status"), $(wc -l <"$a.out") + $(wc -l <"$a.err") lines"
}

for precision in fp32 bf16; do
  for kind in none svd cola lax; do
    train "${kind}_${precision}" 1 --set model.bottleneck=$kind --set training.precision=$precision
  done
done
# tiny.toml warms up for longer than 16 steps: the decay after a short warmup, each shape.
train cosine_decay 1 --set lr_scheduler.warmup_steps=4 --set lr_scheduler.decay=cosine
train linear_decay 1 --set lr_scheduler.warmup_steps=4 --set lr_scheduler.decay=linear
train btp_tp2 2 --set model.bottleneck=cola --set parallel.tp=2 --set parallel.tp_mode=btp
train vanilla_tp2 2 --set model.bottleneck=svd --set parallel.tp=2 --set parallel.tp_mode=vanilla
train full_tp2 2 --set model.bottleneck=none --set parallel.tp=2 --set parallel.tp_mode=full
# Where the blocks' passes and buffers differ: recomputation, LaX's crossing over TP shards
# and over a pipeline boundary.
train btp_tp2_lowrank_lax 2 --set model.bottleneck=lax --set parallel.tp=2 \
  --set parallel.tp_mode=btp --set training.recompute=lowrank
train vanilla_tp2_block_lax 2 --set model.bottleneck=lax --set parallel.tp=2 \
  --set parallel.tp_mode=vanilla --set training.recompute=block
train lax_pp2 2 --set model.bottleneck=lax --set parallel.pp=2
train pp2_dp2_zero_bf16 4 --set model.bottleneck=cola --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.zero=1 --set training.grad_accum_steps=2 --set training.precision=bf16
train_resumed

bench_tp_volumes
bench_paper

cli help 1 --help
cli train_help 1 train --help
cli help_config 1 train --help-config
cli unknown_key 1 train configs/tiny.toml --set model.bogus=1
cli steps_out_of_range 1 train configs/tiny.toml --set training.steps=0
cli lr_out_of_range 1 train configs/tiny.toml --set optimizer.lr=-1
cli bad_decay 1 train configs/tiny.toml --set lr_scheduler.decay=exponential
cli bad_tp 2 train configs/tiny.toml --set parallel.tp=3
printf '[model]\nhidden_size = 64\nsurprise = 1\n[training]\nsteps = "many"\n' >"$work/bad.toml"
cli bad_toml 1 train "$work/bad.toml"
cli plan 1 plan configs/llama7b_cola.toml --cluster clusters/h100.toml
cli plan_json 1 plan configs/llama7b_cola.toml --cluster clusters/h100.toml --json --all
cli bench_tp_fit 2 bench tp configs/tiny.toml "${shape[@]}" --fit 12MiB --fit-max 16
cli bench_tp_fit_json 2 bench tp configs/tiny.toml "${shape[@]}" --fit 12MiB --fit-max 16 --json

if ((failures)); then
  echo "same_bits: $failures of $checks checks not the same"
  exit 1
fi
echo "same_bits: all $checks checks the same"
