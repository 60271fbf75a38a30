#!/usr/bin/env bash
# Times two bottle binaries on the same CPU work, interleaved (old, new, old, new, ...), so that
# a change that must not cost speed is measured against the noise of a shared machine rather
# than against a figure taken at another hour:
#   tools/speed_ab.sh OLD_BOTTLE NEW_BOTTLE [ROUNDS]
# Each round runs `bench step` (none and cola, fp32 and bf16, d 512) and `bench tp` (btp, 2
# ranks) once with each binary. Prints each row's median over the rounds and new / old (a
# ratio inside the spread of the rounds is noise), and exits 1 when bench tp's all-reduce
# volumes differ between the two.
set -euo pipefail
old=$(realpath "$1") new=$(realpath "$2")
rounds=${3:-5}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
step=(bench step --hidden 512 --ffn 1376 --layers 2 --heads 8 --vocab 4096 --rank 128 --batch 2
  --seq 256 --kinds none,cola --precision fp32,bf16 --steps 3 --warmup 1 --torch false --json)
tp=(bench tp --set model.hidden_size=512 --set model.intermediate_size=1376 --set model.num_layers=2
  --set model.num_heads=8 --set model.rank=128 --set model.vocab_size=4096
  --set model.max_seq_len=256 --set training.micro_batch_size=2 --set training.seq_len=256
  --set parallel.tp=2
  --steps 3 --warmup 1 --json)
mpi=(mpirun --oversubscribe --allow-run-as-root -np 2)
for ((i = 0; i < rounds; ++i)); do
  for which in old new; do
    bin=$old
    [ "$which" = new ] && bin=$new
    "$bin" "${step[@]}" >>"$work/step.$which" 2>/dev/null
    "${mpi[@]}" "$bin" "${tp[@]}" configs/tiny.toml >>"$work/tp.$which" 2>"$work/tp.err" ||
      { echo "speed_ab: bench tp failed: $(grep -m1 error "$work/tp.err")" >&2; exit 1; }
  done
done
python3 - "$work" <<'EOF'
import json, statistics, sys, pathlib
work = pathlib.Path(sys.argv[1])
def rows(name):
    out = {}
    for line in (work / name).read_text().splitlines():
        try:
            j = json.loads(line)
        except ValueError:
            continue
        if "ms_per_step" in j:
            key = f"step {j['kind']} {j['precision']}"
            out.setdefault(key, []).append(j["ms_per_step"])
        elif "iter_ms" in j:
            key = f"tp {j['variant']}"
            out.setdefault(key, []).append(j["iter_ms"])
            volumes.setdefault(name.split(".")[1], {})[key] = (
                j["fwd_elems_per_block"], j["bwd_elems_per_block"], j["collectives_per_block"])
    return out
volumes = {}
for kind in ("step", "tp"):
    old, new = rows(f"{kind}.old"), rows(f"{kind}.new")
    for key in sorted(old):
        if key not in new:
            continue
        o, n = statistics.median(old[key]), statistics.median(new[key])
        print(f"{key:24s} old {o:9.1f} ms [{min(old[key]):.1f}-{max(old[key]):.1f}]  "
              f"new {n:9.1f} ms [{min(new[key]):.1f}-{max(new[key]):.1f}]  new/old {n / o:.3f}")
# The all-reduce volumes per block must not move at all.
same = volumes.get("old") == volumes.get("new")
print("bench tp volumes (elements fwd, bwd, collectives per block):",
      "the same" if same else f"DIFFER: old {volumes.get('old')} new {volumes.get('new')}")
sys.exit(0 if same else 1)
EOF
