#!/usr/bin/env bash
# The GPU window: bottle's checks and benchmarks on a machine with one NVIDIA GPU (an H200),
# as one prepared script whose stages run in order of value, each within its own time budget,
# so that a window cut short still returns the most important answers.
#
#   a  every Backend op on cuda against the reference backend, f32 and bf16, and by finite
#      differences, with a synchronous error check after each op (test_device_ops cuda)
#   b  the whole model on cuda against the cpu backend, loss and every gradient, none / svd /
#      cola / lax, fp32 and bf16, with cuDNN's attention (auto) and the own kernels
#      (test_model_backends cuda, cuda:own)
#   c  30 bf16 training steps through cuDNN's attention and through the own tensor-core
#      kernels against the cpu backend (CoLA at head dim 128; full rank at 64 unless --quick)
#   d  bench step, bf16: a CoLA-1B-like model (d 2048, d_ff 5472, r 512, 24 blocks, 16 heads,
#      4 × 2048 tokens) and its full-rank twin, with PyTorch eager on the same GPU
#   e  the same with torch.compile
#   f  the profile split of the same two steps (--profile: every op timed by device events)
#   g  bottle train across ranks on the GPU: TP 2 staged through MPI, NCCL, against the cpu
#      backend (40 fp32 steps each)
#
#   scripts/gpu_check.sh [--quick] [--stages LETTERS] [--rehearse] [--budgets]
#
#   --quick      a, c and d only, on shorter budgets (within 4 minutes)
#   --stages     the stages to run, e.g. --stages abcd (a device call of 10 minutes) and then
#                --stages efg in a second call
#   --rehearse   no GPU needed: the binaries of build/ ($BOTTLE_BUILD_DIR), every GPU stage
#                skipped with its reason, and a tiny `bench step` on the cpu backend feeding the
#                summary, so that the script's logic and the summary's fields are tested
#                without a GPU (tools/test_gpu_window.sh, the ctest gpu_window)
#   --budgets    prints the stage table with its budgets and exits
#
# Outputs under $OUT (else gpu-check/), written as each stage ends, at most 4 files (the device
# tool returns 8): summary.json (every figure the GPU targets name, each stage's status and
# time; rewritten after every stage), window.log (all the script printed), stages.log (each
# stage's full log, appended as it ends) and bench.jsonl (bench step's JSON rows).
#
# The binaries: gpu-bundle.tar.xz when present (scripts/gpu_bundle.sh makes it on a Debian 12
# machine, for a GPU machine whose image lacks bottle's Debian libraries), else build-cuda/ (built
# here when absent; slow: prepare the bundle instead). Each comes with the GPU modules
# (libbottle_cuda.so, libbottle_nccl.so) beside bottle, which it opens at run time. cuDNN
# (bottle opens libcudnn.so.9 at run time; the bundle does not carry it) is the machine's: the
# loader's, else the nvidia-cudnn-cu13 wheel's, else PyTorch's. Exit status: 0 when every stage
# that ran passed.
set -uo pipefail
cd "$(dirname "$0")/.."

# The stages: letter, budget in seconds (full, --quick; 0 = not in --quick), description. The
# budgets of a-d add up to 8 minutes. The H200 run of 2026-12-04 (docs/design.md §19) took
# a 18 s, b 5 s, c 30 s, d 107 s, f 55 s, e 186 s and g 14 s: d is mostly the PyTorch peer's
# start and its 1.3 B-parameter model, and e torch.compile's compilation, which ran past
# 240 s the first time and took 186 s when run again on the same machine.
stage_table=(
  "a 100 60 every op against the reference backend"
  "b 130 0 the whole model against the cpu backend"
  "c 80 60 bf16 training through cuDNN and the own attention"
  "d 170 110 bench step with PyTorch eager"
  "e 330 0 bench step with torch.compile"
  "f 90 0 the profile split"
  "g 90 0 bottle train across ranks: TP 2, NCCL"
  "r 120 120 (--rehearse only) a tiny bench step on the cpu backend feeding the summary"
)

quick=0 rehearse=0 stages=""
while (($#)); do
  case $1 in
    --quick) quick=1 ;;
    --rehearse) rehearse=1 ;;
    --stages) stages=${2:?--stages needs letters}; shift ;;
    --budgets)
      printf '%-6s %8s %8s  %s\n' stage full quick what
      for row in "${stage_table[@]}"; do
        read -r letter full short what <<<"$row"
        printf '%-6s %8s %8s  %s\n' "$letter" "$full" "$short" "$what"
      done
      exit 0 ;;
    *) echo "usage: scripts/gpu_check.sh [--quick] [--stages LETTERS] [--rehearse] [--budgets]" >&2
       exit 2 ;;
  esac
  shift
done

out=${OUT:-gpu-check}
mkdir -p "$out"
out=$(cd "$out" && pwd)
work=${GPU_CHECK_WORK:-$(mktemp -d /tmp/gpu-check.XXXXXX)}
mkdir -p "$work"
: >"$out/stages.log"
: >"$out/bench.jsonl"
exec > >(tee -a "$out/window.log") 2>&1
start=$SECONDS
declare -A status
: >"$work/stages.tsv"  # letter, status, seconds, budget: one line per stage that ended

# --- Binaries and libraries.
bundle_env() {
  rm -rf "$work/gpu-bundle"
  tar -C "$work" -xJf gpu-bundle.tar.xz 2>/dev/null ||
    python3 -c "import tarfile; tarfile.open('gpu-bundle.tar.xz').extractall('$work')"
  local b=$work/gpu-bundle
  bin=$b/bin libs=$b/lib device_ops=$b/bin/test_device_ops model_backends=$b/bin/test_model_backends
  # The C++ runtime: the machine's own when it is at least Debian 12's (GCC 12), since its CUDA
  # libraries may need a newer one than the bundle's; the bundle's otherwise.
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib64; do
    if [ -f "$dir/libstdc++.so.6" ] && grep -qa GLIBCXX_3.4.30 "$dir/libstdc++.so.6"; then
      rm -f "$libs/libstdc++.so.6" "$libs/libgcc_s.so.1"
      break
    fi
  done
  # Open MPI and PMIx relocated from their Debian paths; mpirun starts local ranks only.
  export PATH=$b/ompi/usr/bin:$PATH OPAL_PREFIX=$b/ompi/usr OPAL_SYSCONFDIR=$b/ompi/etc/openmpi \
    PMIX_INSTALL_PREFIX=$b/ompi/usr/lib/x86_64-linux-gnu/pmix2 OMPI_MCA_plm_rsh_agent=false
  echo "binaries: gpu-bundle.tar.xz"
}
libs=""
if [ "$rehearse" = 1 ]; then
  build=${BOTTLE_BUILD_DIR:-build}
  bin=$build device_ops=$build/tests/backend/test_device_ops
  model_backends=$build/tests/model/test_model_backends
  echo "binaries: $build/ (rehearsal)"
elif [ -f gpu-bundle.tar.xz ]; then
  bundle_env
else
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DBOTTLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$work/configure.log" 2>&1 && cmake --build build-cuda -j"$(nproc)" --target bottle \
    test_device_ops test_model_backends >"$work/build.log" 2>&1 || {
    echo "build failed:"
    tail -n 30 "$work/build.log" "$work/configure.log" 2>/dev/null
    exit 1
  }
  bin=build-cuda device_ops=build-cuda/tests/backend/test_device_ops
  model_backends=build-cuda/tests/model/test_model_backends
  echo "binaries: built in build-cuda/"
fi
# This machine's CUDA libraries: the loader's, the toolkit's, or PyTorch's wheels'. NVRTC:
# cuDNN compiles some of its attention engines at run time.
sites=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
for name in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2 libnvrtc.so.13; do
  ldconfig -p 2>/dev/null | grep -q "$name" && continue
  # shellcheck disable=SC2086
  dir=$(find /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib $sites -name "$name" 2>/dev/null |
    head -n 1 | xargs -r dirname)
  [ -n "$dir" ] && libs=$libs:$dir
done
if ! ldconfig -p 2>/dev/null | grep -q 'libcudnn\.so\.9'; then
  cudnn_dir=$(python3 -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
  [ -f "$cudnn_dir/libcudnn.so.9" ] ||
    cudnn_dir=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
  [ -f "$cudnn_dir/libcudnn.so.9" ] && libs=$libs:$cudnn_dir
fi
[ -n "$libs" ] && export LD_LIBRARY_PATH=${libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none

nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv 2>/dev/null
version=$("$bin/bottle" --version 2>&1)
echo "$version"
# Why the GPU stages cannot run here (empty when they can): the backend's own reason, no GPU
# or a CUDA module (libbottle_cuda.so, which the binaries open at run time) that cannot be
# loaded, with dlerror's words.
gpu_reason=$(grep '^backend cuda: ' <<<"$version" | grep -o '(no CUDA device.*)$' | sed 's/^(//; s/)$//')
[ -n "$gpu_reason" ] || gpu_reason=$(grep '^backend cuda: ' <<<"$version" |
  grep -o "this build's CUDA module could not be loaded.*$")
grep -q '^backend cuda: ' <<<"$version" || gpu_reason="this build has no cuda backend"

# --- The summary: every figure the GPU targets name, from bench.jsonl and the stages' logs;
# rewritten after every stage, so a window cut short still returns what finished.
summarize() {
  python3 - "$out" "$work" "$rehearse" "$((SECONDS - start))" "$stage_order" <<'PY'
import json, os, sys
out, work, rehearse, elapsed, order = sys.argv[1:6]
status, seconds, budget = {}, {}, {}
for line in open(os.path.join(work, "stages.tsv")):
    letter, st, secs, limit = line.rstrip("\n").split("\t")
    status[letter], seconds[letter], budget[letter] = st, secs, limit
rows = []
path = os.path.join(out, "bench.jsonl")
for line in open(path) if os.path.exists(path) else []:
    line = line.strip()
    if line.startswith("{"):
        try: rows.append(json.loads(line))
        except ValueError: pass
def row(kind, stage, want=None):
    for r in rows:
        if r.get("kind") == kind and r.get("stage") == stage and (want is None or want in r):
            return r
    return {}
def num(r, key):
    v = r.get(key)
    return v if isinstance(v, (int, float)) else None
def ratio(a, b):
    return a / b if a is not None and b else None
s = {"rehearsal": rehearse == "1", "elapsed_s": int(elapsed), "stages": {}}
for letter in order:
    s["stages"][letter] = {"status": status.get(letter, "not run"),
                           "seconds": int(seconds[letter]) if letter in seconds else None,
                           "budget_s": int(budget[letter]) if letter in budget else None}
eager, compiled, prof = {}, {}, {}
for kind in ("cola", "none"):
    d, e, f = row(kind, "d"), row(kind, "e"), row(kind, "f")
    eager[kind], compiled[kind], prof[kind] = d, e, f
    s[kind] = {
        "step_ms": num(d, "ms_per_step"),
        "mfu_nominal": num(d, "mfu_nominal"),
        "mfu_measured_peak": num(d, "mfu"),
        "host_waits_per_step": num(d, "host_waits_per_step"),
        "torch_eager_ms": num(d, "torch_ms_per_step"),
        "speedup_vs_eager": num(d, "speedup_vs_torch"),
        "torch_compile_ms": num(e, "torch_compile_ms_per_step"),
        "speedup_vs_compile": num(e, "speedup_vs_torch_compile"),
        "ops_per_step": num(f, "ops_per_step"),
        "attention_ms_per_step": num(f, "attention_ms_per_step"),
        "kernel_ms_per_step": num(f, "kernel_ms_per_step"),
        "attention": d.get("attention") or f.get("attention"),
        "backend": d.get("backend") or f.get("backend"),
    }
s["cola_vs_full_rank"] = ratio(s["none"]["step_ms"], s["cola"]["step_ms"])
c = s["cola"]
def target(value, op, bound):
    if value is None: return "not measured"
    return "met" if (value <= bound if op == "<=" else value >= bound) else "missed"
s["targets"] = {
    "cola_step_ms <= 100": target(c["step_ms"], "<=", 100),
    "cola_step_ms <= 72": target(c["step_ms"], "<=", 72),
    "cola_attention_ms <= 16": target(c["attention_ms_per_step"], "<=", 16),
    "host_waits_per_step <= 1": target(c["host_waits_per_step"], "<=", 1),
    "speedup_vs_compile >= 1.2": target(c["speedup_vs_compile"], ">=", 1.2),
    "cola_vs_full_rank >= 1.6": target(s["cola_vs_full_rank"], ">=", 1.6),
}
if s["rehearsal"]:
    s["targets"] = {k: "not measured (rehearsal on the cpu backend)" for k in s["targets"]}
losses = os.path.join(work, "train_losses.txt")
s["train_losses"] = open(losses).read().splitlines() if os.path.exists(losses) else []
json.dump(s, open(os.path.join(out, "summary.json.tmp"), "w"), indent=1)
os.replace(os.path.join(out, "summary.json.tmp"), os.path.join(out, "summary.json"))
PY
}

# run_stage LETTER: runs stage_LETTER within its budget, logs it, records its status and time.
run_stage() {
  local letter=$1 row full short what limit log=$work/stage_$1.log
  for row in "${stage_table[@]}"; do
    read -r l full short what <<<"$row"
    [ "$l" = "$letter" ] && break
  done
  limit=$full
  [ "$quick" = 1 ] && limit=$short
  echo
  echo "== [$((SECONDS - start)) s] $letter. $what (budget $limit s)"
  local t0=$SECONDS rc=0
  if [ -n "$gpu_reason" ] && [ "$letter" != r ]; then
    status[$letter]="skipped: $gpu_reason"
  else
    timeout --kill-after=10 "$limit" bash -c \
      "$(declare -f); $(declare -p bin device_ops model_backends work out quick); stage_$letter" \
      >"$log" 2>&1 || rc=$?
    case $rc in
      0) status[$letter]=ok ;;
      124 | 137) status[$letter]="timed out after $limit s" ;;
      *) status[$letter]="failed ($rc)" ;;
    esac
    grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|vs cpu|worst|^(cola|none) |^\{|attention:|rror' "$log" |
      grep -v '^{' | tail -n 40 | sed 's/^/  /'
  fi
  local took=$((SECONDS - t0))
  printf '%s\t%s\t%s\t%s\n' "$letter" "${status[$letter]}" "$took" "$limit" >>"$work/stages.tsv"
  echo "   $letter: ${status[$letter]} in $took s"
  { echo "===== stage $letter: $what: ${status[$letter]} in $took s"; cat "$log" 2>/dev/null; } >>"$out/stages.log"
  summarize
}

# --- The stages. Each runs in a bash of its own under `timeout`, with bin, device_ops,
# model_backends, work, out and quick set.
stage_a() { env BOTTLE_CUDA_SYNC=1 "$device_ops" cuda; }
stage_b() {
  local rc=0
  "$model_backends" cuda || rc=$?
  "$model_backends" cuda:own || rc=$?
  return $rc
}
ensure_data() {  # a byte-level corpus: the Python standard library's sources
  [ -f "$work/data/data_train_00000.bin" ] && return 0
  mkdir -p "$work/data"
  mapfile -t corpus < <(find /usr/lib/python3* -name '*.py' -size -64k 2>/dev/null | sort | head -n 600)
  "$bin/bottle" prepare --input "${corpus[@]}" --output "$work/data" >"$work/prepare.log" 2>&1
}
train_run() {  # train_run NAME NP [--set KEY=VALUE ...]
  local name=$1 np=$2
  shift 2
  mpirun -np "$np" --oversubscribe "$bin/bottle" train configs/tiny.toml \
    --set "data.train=$work/data/data_train_*.bin" --set "data.val=$work/data/data_val_*.bin" \
    --set training.eval_interval=0 --set checkpoint.interval=0 --set metrics.log_freq=1 \
    --set metrics.plot= --set "checkpoint.folder=$work/runs/$name" "$@" >"$work/train_$name.log" 2>&1
  local rc=$?
  grep -m1 '^attention:' "$work/train_$name.log" | sed "s/^/$name: /"
  [ $rc = 0 ] || { echo "$name failed ($rc):"; tail -n 15 "$work/train_$name.log"; }
  return $rc
}
compare_losses() {  # compare_losses REFERENCE RUN...: the worst relative loss difference per run
  python3 - "$work/runs" "$@" <<'PY' | tee -a "$work/train_losses.txt"
import json, os, sys
root, ref, runs = sys.argv[1], sys.argv[2], sys.argv[3:]
def losses(name):
    path = os.path.join(root, name, "metrics.jsonl")
    if not os.path.exists(path): return {}
    rows = [json.loads(l) for l in open(path) if l.strip()]
    return {r["step"]: r["loss"] for r in rows if "loss" in r and "step" in r}
want, ok = losses(ref), True
for run in runs:
    got = losses(run)
    common = [s for s in want if s in got]
    if not common:
        print(f"{run} vs {ref}: missing"); ok = False; continue
    worst = max(abs(got[s] - want[s]) / abs(want[s]) for s in common)
    print(f"{run} vs {ref}: {len(common)} steps, loss {want[common[0]]:.4f} -> {want[common[-1]]:.4f}, "
          f"worst relative difference {worst:.2e}")
    ok &= worst < 2e-2
sys.exit(0 if ok else 1)
PY
}
stage_c() {
  ensure_data || return 1
  local specs=("cola 512" "none 256") rc=0
  [ "$quick" = 1 ] && specs=("cola 512")
  for spec in "${specs[@]}"; do
    read -r kind width <<<"$spec"
    local shape=(--set training.steps=30 --set model.bottleneck="$kind"
      --set model.hidden_size="$width" --set model.num_heads=4
      --set model.intermediate_size=$((2 * width)) --set model.rank=$((width / 4))
      --set training.precision=bf16)
    train_run "bf16-$kind-cpu" 1 "${shape[@]}" --set training.backend=cpu || rc=1
    train_run "bf16-$kind-cudnn" 1 "${shape[@]}" --set training.backend=cuda \
      --set training.attention=cudnn || rc=1
    train_run "bf16-$kind-own" 1 "${shape[@]}" --set training.backend=cuda \
      --set training.attention=own || rc=1
    compare_losses "bf16-$kind-cpu" "bf16-$kind-cudnn" "bf16-$kind-own" || rc=1
  done
  return $rc
}
# tag_rows FILE STAGE: bench step's JSON rows of FILE into bench.jsonl, each tagged with STAGE.
tag_rows() {
  python3 -c '
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        row = json.loads(line); row["stage"] = sys.argv[2]; print(json.dumps(row))
' "$1" "$2" >>"$out/bench.jsonl"
}
# bench step at the CoLA-1B-like shape; its JSON rows go to bench.jsonl, tagged with the stage.
bench_1b() {  # bench_1b STAGE [bench step options]
  local stage=$1
  shift
  local steps=(--steps 5 --warmup 2)
  [ "$quick" = 1 ] && steps=(--steps 3 --warmup 1)
  "$bin/bottle" bench step --backend cuda --precision bf16 --kinds cola,none --vocab 32000 \
    --hidden 2048 --ffn 5472 --layers 24 --heads 16 --rank 512 --batch 4 --seq 2048 \
    "${steps[@]}" --peak-tflops 989 --json "$@" | tee "$work/bench_$stage.jsonl"
  local rc=${PIPESTATUS[0]}
  tag_rows "$work/bench_$stage.jsonl" "$stage"
  return "$rc"
}
stage_d() { bench_1b d --torch true; }
stage_e() { bench_1b e --torch true --torch-compile; }
stage_f() { bench_1b f --torch false --profile; }
stage_g() {
  ensure_data || return 1
  local rc=0 fp32=(--set training.steps=40)
  train_run cpu 1 "${fp32[@]}" --set training.backend=cpu || rc=1
  train_run cuda_tp1 1 "${fp32[@]}" --set training.backend=cuda --set parallel.comm=mpi || rc=1
  train_run cuda_tp2_mpi 2 "${fp32[@]}" --set training.backend=cuda --set parallel.comm=mpi \
    --set parallel.tp=2 || rc=1
  train_run cuda_nccl 1 "${fp32[@]}" --set training.backend=cuda --set parallel.comm=nccl || rc=1
  compare_losses cpu cuda_tp1 cuda_tp2_mpi cuda_nccl || rc=1
  return $rc
}
# The rehearsal's stand-in for d: the same bench at a tiny shape on the cpu backend, so that
# the summary is filled from real rows.
stage_r() {
  "$bin/bottle" bench step --backend cpu --precision bf16 --kinds cola,none --vocab 256 \
    --hidden 64 --ffn 128 --layers 1 --heads 4 --rank 16 --batch 1 --seq 32 --steps 2 \
    --warmup 1 --peak-tflops 989 --torch false --profile --json | tee "$work/bench_r.jsonl"
  local rc=${PIPESTATUS[0]}
  tag_rows "$work/bench_r.jsonl" d
  tag_rows "$work/bench_r.jsonl" f
  return "$rc"
}

if [ -z "$stages" ]; then
  stages=abcdefg
  [ "$quick" = 1 ] && stages=acd
fi
stage_order=$stages
[ "$rehearse" = 1 ] && stage_order=${stages}r
summarize
for ((i = 0; i < ${#stage_order}; ++i)); do run_stage "${stage_order:i:1}"; done

echo
echo "== summary ($((SECONDS - start)) s): $out/summary.json"
python3 - "$out/summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
for letter, st in s["stages"].items():
    print(f"  {letter}: {st['status']} ({st['seconds']} s of {st['budget_s']})")
for kind in ("cola", "none"):
    k = s[kind]
    print(f"  {kind}: step {k['step_ms']} ms, MFU {k['mfu_nominal']}, attention {k['attention_ms_per_step']} ms, "
          f"host waits {k['host_waits_per_step']}, ops {k['ops_per_step']}, x eager {k['speedup_vs_eager']}, "
          f"x compile {k['speedup_vs_compile']}")
print(f"  CoLA vs full rank: {s['cola_vs_full_rank']}")
for name, verdict in s["targets"].items():
    print(f"  target {name}: {verdict}")
PY
failed=0
for ((i = 0; i < ${#stage_order}; ++i)); do
  case ${status[${stage_order:i:1}]} in ok | skipped*) ;; *) failed=1 ;; esac
done
exit $failed
