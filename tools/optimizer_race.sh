#!/usr/bin/env bash
# Muon against AdamW on real text (issue 58's "what it buys"): the same CoLA model, the same
# tokens in the same order, each optimizer at each of three learning rates; then, per optimizer,
# its best run's final validation loss, and the tokens each optimizer's best run needed to
# reach AdamW's best final validation loss, with the curves drawn by `bottle plot`.
#
#   tools/optimizer_race.sh BOTTLE DATA_DIR OUT_DIR [STEPS] [LRS]
#
# DATA_DIR holds shards of `bottle prepare` (data_train_*.bin, data_val_*.bin) and its
# tokenizer; the model is configs/tiny_bpe.toml's (CoLA, d 128, 4 blocks, rank 32) with the
# vocabulary of DATA_DIR's tokenizer. STEPS (default 1500) of 8 × 128 tokens; LRS (default
# "1e-3 2e-3 4e-3"). Validation every 100 steps on 32 batches. Everything is written under
# OUT_DIR (a run folder per optimizer and rate, race.md, race.png with each optimizer's best run,
# race_all.png with every run); nothing else is touched. Finished runs are kept, so a second
# call with more rates runs only the new ones.
set -euo pipefail
if (($# < 3)); then
  sed -n '2,13p' "$0" >&2
  exit 2
fi
bottle=$1 data=$2 out=$3 steps=${4:-1500} lrs=${5:-"1e-3 2e-3 4e-3"}
here=$(cd "$(dirname "$0")/.." && pwd)
[[ -x $bottle ]] || { echo "optimizer_race: $bottle is not an executable" >&2; exit 2; }
compgen -G "$data/data_train_*.bin" >/dev/null ||
  { echo "optimizer_race: $data holds no data_train_*.bin" >&2; exit 2; }
vocab=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' \
  "$data/data_train.json" 2>/dev/null || echo 4096)
mkdir -p "$out"
for optimizer in adamw muon; do
  for lr in $lrs; do
    run=$out/${optimizer}_lr$lr
    [[ -f $run/metrics.jsonl ]] && grep -q '"val_loss"' "$run/metrics.jsonl" &&
      [[ -d $run/step_$(printf %08d "$steps") ]] && continue
    rm -rf "$run"
    "$bottle" train "$here/configs/tiny_bpe.toml" \
      --set model.vocab_size="$vocab" --set training.steps="$steps" \
      --set training.eval_interval=100 --set training.eval_batches=32 \
      --set optimizer.name=\""$optimizer"\" --set optimizer.lr="$lr" \
      --set data.train=\""$data/data_train_*.bin"\" --set data.val=\""$data/data_val_*.bin"\" \
      --set checkpoint.folder=\""$run"\" --set checkpoint.interval="$steps" \
      --set metrics.plot=\"\" >"$run.log" 2>&1
  done
done
python3 - "$out" "$lrs" <<'EOF'
import json, sys
out, lrs = sys.argv[1], sys.argv[2].split()
def curve(run):
    vals, speeds = [], []
    for line in open(f"{out}/{run}/metrics.jsonl"):
        j = json.loads(line)
        if "val_loss" in j:  # 8 x 128 tokens a step (configs/tiny_bpe.toml)
            vals.append((j["step"] * 1024, j["val_loss"]))
        if "tokens_per_s" in j:
            speeds.append(j["tokens_per_s"])
    speeds.sort()
    return vals, (speeds[len(speeds) // 2] if speeds else 0.0)
best = {}
rows = []
for opt in ("adamw", "muon"):
    for lr in lrs:
        vals, speed = curve(f"{opt}_lr{lr}")
        rows.append((opt, lr, vals[-1][1], speed))
        if opt not in best or vals[-1][1] < best[opt][2]:
            best[opt] = (lr, vals, vals[-1][1], speed)
target = best["adamw"][2]
def reach(vals):
    for tokens, loss in vals:
        if loss <= target:
            return tokens
    return None
with open(f"{out}/race.md", "w") as f:
    f.write("| optimizer | lr | final val loss | median tokens/s |\n|---|---|---|---|\n")
    for opt, lr, loss, speed in rows:
        f.write(f"| {opt} | {lr} | {loss:.4f} | {speed:.0f} |\n")
    a, m = reach(best["adamw"][1]), reach(best["muon"][1])
    f.write(f"\nAdamW's best final val loss {target:.4f} (lr {best['adamw'][0]}); "
            f"Muon's best {best['muon'][2]:.4f} (lr {best['muon'][0]}).\n")
    f.write(f"Tokens to reach {target:.4f}: AdamW {a}, Muon {m}")
    if a and m:
        f.write(f" ({a / m:.2f}x fewer with Muon)")
    f.write(" (validation every 100 steps: the first evaluation at or below it).\n")
print(open(f"{out}/race.md").read())
open(f"{out}/best.txt", "w").write(f"adamw_lr{best['adamw'][0]} muon_lr{best['muon'][0]}\n")
EOF
# Each optimizer's best run in race.png, every run in race_all.png.
read -r best_adamw best_muon <"$out/best.txt"
{ "$bottle" plot "$out/$best_adamw/metrics.jsonl" "$out/$best_muon/metrics.jsonl" \
    --out "$out/race.png" &&
  "$bottle" plot "$out"/adamw_lr*/metrics.jsonl "$out"/muon_lr*/metrics.jsonl \
    --out "$out/race_all.png"; } >/dev/null 2>&1 ||
  echo "optimizer_race: bottle plot failed (no gnuplot?); race.md stands" >&2
