#!/usr/bin/env bash
# Runs one fixed set of small CPU training runs with two bottle binaries and compares what they
# wrote: every value of metrics.jsonl except times, rates and memory, and every file of every
# checkpoint byte for byte. For a change that must not move a bit on the CPU backends.
#   tools/same_bits.sh OLD_BOTTLE NEW_BOTTLE [WORK_DIR]
# The set: configs/tiny.toml shrunk to d 64 and 16 steps for none / svd / cola / lax in fp32
# and bf16; TP 2 in each mode (btp, vanilla, full); LaX under btp with lowrank recomputation,
# under vanilla with block recomputation and over a 2-stage pipeline; a 2 × 2 pipeline × DP
# with ZeRO-1 in bf16 with accumulation; a run resumed halfway. Exits 1 naming the first run that differs.
# SAME_BITS_ONLY=REGEX runs only the runs whose names match (for a change that moves some
# bits on purpose: the others must still be the same).
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
work=${3:-$(mktemp -d)}
cd "$(dirname "$0")/.."
mkdir -p "$work/old" "$work/new" "$work/run"
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
# shellcheck disable=SC2086
[ -f "$work/data/data_train.json" ] || "$new" prepare --input $corpus --output "$work/data" >/dev/null
common=(--set model.hidden_size=64 --set model.intermediate_size=128 --set model.num_layers=4
  --set model.num_heads=4 --set model.rank=16 --set training.micro_batch_size=4
  --set training.seq_len=64 --set training.steps=16 --set training.eval_interval=8
  --set training.eval_batches=2 --set checkpoint.interval=8 --set checkpoint.keep=2
  --set metrics.log_freq=1 --set metrics.plot=
  --set "data.train=$work/data/data_train_*.bin" --set "data.val=$work/data/data_val_*.bin")
mpi=(mpirun --oversubscribe --allow-run-as-root -np)

run() {  # run NAME NP ARGS...: both binaries, each into its own folder
  local name=$1 np=$2
  shift 2
  [[ $name =~ ${SAME_BITS_ONLY:-.} ]] || return 0
  for which in old new; do
    local bin=$old
    [ $which = new ] && bin=$new
    # Both into one folder, moved aside after: trainer_state.json records the folder.
    local dir="$work/run/$name"
    rm -rf "$dir" "$work/$which/$name"
    local launch=()
    [ "$np" = 1 ] || launch=("${mpi[@]}" "$np")
    "${launch[@]}" "$bin" train configs/tiny.toml "${common[@]}" --set "checkpoint.folder=$dir" \
      "$@" >"$dir.log" 2>&1 || { echo "same_bits: $name ($which) failed: $(tail -n 3 "$dir.log")" >&2; exit 1; }
    mv "$dir" "$work/$which/$name"
  done
  compare "$name"
}

compare() {
  local name=$1 a="$work/old/$1" b="$work/new/$1"
  local drop='del(.tokens_per_s, .mfu, .ms, .peak_bytes, .activation_bytes, .memory, .elapsed_s,
    .eta_s, .time, .seconds, .tokens_seen, .epoch)'
  if ! diff <(jq -c "$drop" "$a/metrics.jsonl") <(jq -c "$drop" "$b/metrics.jsonl") >/dev/null; then
    echo "same_bits: $name: metrics.jsonl differs:" >&2
    diff <(jq -c "$drop" "$a/metrics.jsonl") <(jq -c "$drop" "$b/metrics.jsonl") | head -5 >&2
    exit 1
  fi
  local files=0
  for f in $(cd "$a" && find . -path './step_*' -type f | sort); do
    if [[ $f == */trainer_state.json ]]; then
      # The resolved configuration it records gains every key a change adds: the rest must
      # be the same.
      cmp -s <(jq -S 'del(.config)' "$a/$f") <(jq -S 'del(.config)' "$b/$f") ||
        { echo "same_bits: $name: $f differs" >&2; exit 1; }
    else
      cmp -s "$a/$f" "$b/$f" || { echo "same_bits: $name: $f differs" >&2; exit 1; }
    fi
    files=$((files + 1))
  done
  ((files > 0)) || { echo "same_bits: $name: no checkpoint files" >&2; exit 1; }
  echo "same: $name ($(wc -l <"$a/metrics.jsonl") metrics lines, $files checkpoint files)"
}

for precision in fp32 bf16; do
  for kind in none svd cola lax; do
    run "${kind}_${precision}" 1 --set model.bottleneck=$kind --set training.precision=$precision
  done
done
run btp_tp2 2 --set model.bottleneck=cola --set parallel.tp=2 --set parallel.tp_mode=btp
run vanilla_tp2 2 --set model.bottleneck=svd --set parallel.tp=2 --set parallel.tp_mode=vanilla
run full_tp2 2 --set model.bottleneck=none --set parallel.tp=2 --set parallel.tp_mode=full
# Where the blocks' passes and buffers differ: recomputation, LaX's crossing over TP shards
# and over a pipeline boundary.
run btp_tp2_lowrank_lax 2 --set model.bottleneck=lax --set parallel.tp=2 --set parallel.tp_mode=btp \
  --set training.recompute=lowrank
run vanilla_tp2_block_lax 2 --set model.bottleneck=lax --set parallel.tp=2 \
  --set parallel.tp_mode=vanilla --set training.recompute=block
run lax_pp2 2 --set model.bottleneck=lax --set parallel.pp=2
run pp2_dp2_zero_bf16 4 --set model.bottleneck=cola --set parallel.pp=2 --set parallel.dp=2 \
  --set parallel.zero=1 --set training.grad_accum_steps=2 --set training.precision=bf16
# Resumed: 8 steps, then on to 16 from the step-8 checkpoint.
[[ resume =~ ${SAME_BITS_ONLY:-.} ]] || { echo "same_bits: every run the same"; exit 0; }
for which in old new; do
  bin=$old
  [ $which = new ] && bin=$new
  dir="$work/run/resume"
  rm -rf "$dir" "$work/$which/resume"
  "$bin" train configs/tiny.toml "${common[@]}" --set "checkpoint.folder=$dir" \
    --set training.steps=8 >"$dir.log" 2>&1
  "$bin" train configs/tiny.toml "${common[@]}" --set "checkpoint.folder=$dir" --resume \
    >>"$dir.log" 2>&1
  mv "$dir" "$work/$which/resume"
done
compare resume
echo "same_bits: every run the same"
