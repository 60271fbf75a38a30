#!/usr/bin/env bash
# What a checkpoint costs a run (issue 57): a CoLA model of d 512, 8 blocks, trained under
# ZeRO-3 over 2 DP ranks on the fortunes text, saving every 4 steps, once with synchronous saves
# and once with checkpoint.async; prints per rank the peak bytes of each memory tag against the
# plan (the rows after the first save), each save's time as the run reports it ("saved in",
# or "copied in" for an asynchronous save), and the median step time away from the saves
# against the steps right after one.
#   tools/save_bench.sh BOTTLE [WORK_DIR]
# Needs mpirun, python3 and Debian's fortunes (fortunes-min is enough). About 2 minutes on 2
# cores.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: tools/save_bench.sh BOTTLE [WORK_DIR]" >&2; exit 2; }
bottle=$(realpath "$1")
[ -x "$bottle" ] || { echo "save_bench: $1 is not an executable" >&2; exit 2; }
if [ -n "${2:-}" ]; then
  mkdir -p "$2"
  work=$(realpath "$2")
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
[ -n "$corpus" ] || { echo "save_bench: no fortunes (apt-get install fortunes-min)" >&2; exit 2; }
[ -d "$work/data" ] || "$bottle" prepare --input $corpus --output "$work/data" --no-progress >/dev/null
export OMP_NUM_THREADS=1 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
sets=(--set model.hidden_size=512 --set model.intermediate_size=1376 --set model.num_layers=8
  --set model.num_heads=8 --set model.rank=128 --set model.max_seq_len=256
  --set training.seq_len=256 --set training.micro_batch_size=2 --set training.steps=16
  --set training.eval_interval=0 --set checkpoint.interval=4 --set checkpoint.keep=2
  --set parallel.dp=2 --set parallel.zero=3 --set metrics.log_freq=1 --set metrics.plot=
  --set "data.train=$work/data/data_train_*.bin" --set "data.val=$work/data/data_val_*.bin")
for mode in sync async; do
  rm -rf "$work/$mode"
  async=false
  [ "$mode" = async ] && async=true
  mpirun --oversubscribe -np 2 "$bottle" train configs/tiny.toml "${sets[@]}" \
    --set "checkpoint.folder=$work/$mode" --set "checkpoint.async=$async" >"$work/$mode.log" 2>&1 ||
    { echo "save_bench: the $mode run failed: $(grep -m1 error "$work/$mode.log")" >&2; exit 1; }
done
python3 - "$work" <<'EOF'
import json, re, statistics, sys
work = sys.argv[1]
for mode in ("sync", "async"):
    rows = [json.loads(l) for l in open(f"{work}/{mode}/metrics.jsonl") if '"loss"' in l]
    saves = [(int(m.group(1)), float(m.group(3))) for m in re.finditer(
        r"step (\d+): checkpoint \S+ \((saved|copied) in ([0-9.]+) s", open(f"{work}/{mode}.log").read())]
    after = {s + 1 for s, _ in saves}
    away = [r["ms"] for r in rows if r["step"] not in after and r["step"] > 1]
    near = [r["ms"] for r in rows if r["step"] in after]
    print(f"## {mode}: {len(saves)} saves, {'copied' if mode == 'async' else 'saved'} in "
          + ", ".join(f"{t:.3f}" for _, t in saves) + " s")
    print(f"step time: median {statistics.median(away):.0f} ms away from a save, "
          f"{statistics.median(near):.0f} ms right after one ({len(near)} steps)")
    last = rows[-1]
    print("| rank | tag | peak (B) | plan (B) | peak / plan |")
    print("|---|---|---|---|---|")
    for tag, plan in last["memory_plan"].items():
        for r, p in enumerate(plan):
            peak = last["memory"][tag][r]
            print(f"| {r} | {tag} | {peak:,} | {p:,} | {peak / p if p else 0:.3f} |")
EOF
