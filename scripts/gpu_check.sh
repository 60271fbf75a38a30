#!/usr/bin/env bash
# The GPU check of the cuda backend and NCCL, on a machine with one NVIDIA GPU (an H200 here):
#   1. every Backend op on cuda against the reference backend, f32 and bf16, and by finite
#      differences (test_device_ops cuda)
#   2. the whole model on cuda against the cpu backend, loss and every gradient, none / svd /
#      cola / lax, f32 and bf16, and 50 training steps each (test_model_backends cuda)
#   3. `bottle train` on the GPU: TP = 2 on the one GPU with parallel.comm = "mpi" (two ranks
#      share it, collectives staged through the host) against TP = 1, NCCL on one rank, and the
#      cpu backend, 40 steps each on the same data; their losses side by side; then 30 bf16
#      steps at head dims 128 (CoLA) and 64 (full rank), through the tensor-core attention and
#      through cuDNN's SDPA, against the cpu backend
#   4. `bottle bench step` in bf16 for a CoLA-1B-like model (d 2048, d_ff 5472, r 512, 24
#      blocks, s 2048) and its full-rank twin: tokens/s, MFU against the measured GEMM peak and
#      the H200's nominal dense bf16 989 TFLOP/s, and PyTorch on the same GPU (eager and
#      torch.compile)
#
#   scripts/gpu_check.sh [--skip-bench]
#
# The binaries: gpu-bundle.tar.xz when present (scripts/gpu_bundle.sh makes it on a Debian 12
# machine, for a GPU machine whose image lacks bottle's Debian libraries), else a build here
# (build-cuda/). cuDNN (for the SDPA attention; bottle opens libcudnn.so.9 at run time, the bundle
# does not carry it) is the machine's: the loader's, else the nvidia-cudnn-cu13 wheel's, else
# PyTorch's. Logs go to $OUT when set, else gpu-check/. Exit status: non-zero when a
# check failed; every step runs regardless, and the summary at the end says which.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-gpu-check}
mkdir -p "$out"
bench=1
[ "${1:-}" = --skip-bench ] && bench=0
start=$SECONDS
failed=()
step() { echo; echo "== [$((SECONDS - start)) s] $*"; }
check() {  # check NAME COMMAND...: runs it (at most $GPU_CHECK_STEP_S seconds), logs it, records a failure
  local name=$1
  shift
  if timeout "${GPU_CHECK_STEP_S:-300}" "$@" >"$out/$name.log" 2>&1; then
    echo "ok: $name"
  else
    local rc=$?
    echo "FAILED ($rc): $name; last lines of $out/$name.log:"
    tail -n 25 "$out/$name.log"
    failed+=("$name")
  fi
}

step "binaries"
if [ -f gpu-bundle.tar.xz ]; then
  rm -rf /tmp/gpu-bundle
  tar -C /tmp -xJf gpu-bundle.tar.xz 2>/dev/null ||
    python3 -c 'import tarfile; tarfile.open("gpu-bundle.tar.xz").extractall("/tmp")'
  b=/tmp/gpu-bundle
  bin=$b/bin libs=$b/lib
  device_ops=$b/bin/test_device_ops model_backends=$b/bin/test_model_backends
  # The C++ runtime: the machine's own when it is at least Debian 12's (GCC 12), since its CUDA
  # libraries may need a newer one than the bundle's; the bundle's otherwise.
  for dir in /usr/lib/x86_64-linux-gnu /usr/lib64; do
    if [ -f "$dir/libstdc++.so.6" ] && grep -qa GLIBCXX_3.4.30 "$dir/libstdc++.so.6"; then
      rm -f "$libs/libstdc++.so.6" "$libs/libgcc_s.so.1"
      break
    fi
  done
  # Open MPI and PMIx relocated from their Debian paths; mpirun starts local ranks only, so
  # no ssh is needed (a container has none, and Open MPI looks for one at start).
  export PATH=$b/ompi/usr/bin:$PATH OPAL_PREFIX=$b/ompi/usr OPAL_SYSCONFDIR=$b/ompi/etc/openmpi \
    PMIX_INSTALL_PREFIX=$b/ompi/usr/lib/x86_64-linux-gnu/pmix2 OMPI_MCA_plm_rsh_agent=false
  echo "from gpu-bundle.tar.xz"
else
  cmake -S . -B build-cuda -DCMAKE_BUILD_TYPE=Release -DBOTTLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    >"$out/configure.log" 2>&1 && cmake --build build-cuda -j"$(nproc)" --target bottle \
    test_device_ops test_model_backends >"$out/build.log" 2>&1 || {
    echo "build failed: $out/configure.log, $out/build.log"
    tail -n 30 "$out/build.log" "$out/configure.log" 2>/dev/null
    exit 1
  }
  bin=build-cuda libs=
  device_ops=build-cuda/tests/core/test_device_ops model_backends=build-cuda/tests/model/test_model_backends
  echo "built in build-cuda/"
fi
# This machine's CUDA libraries: the loader's, the toolkit's, or PyTorch's wheels'.
sites=$(python3 -c 'import site; print(" ".join(site.getsitepackages()))' 2>/dev/null)
# NVRTC: cuDNN compiles some of its attention engines at run time.
for name in libcudart.so.13 libcublasLt.so.13 libcublas.so.13 libnccl.so.2 libnvrtc.so.13; do
  ldconfig -p | grep -q "$name" && continue
  # shellcheck disable=SC2086
  dir=$(find /usr/local/cuda*/lib* /usr/local/cuda*/targets/*/lib $sites -name "$name" 2>/dev/null |
    head -n 1 | xargs -r dirname)
  if [ -n "$dir" ]; then libs=$libs:$dir; else echo "warning: $name not found"; fi
done
# cuDNN 9 for the SDPA attention: without it the own kernels run, and the cuDNN rows fail.
if ! ldconfig -p | grep -q 'libcudnn\.so\.9'; then
  cudnn_dir=$(python3 -c 'import os, nvidia.cudnn as m; print(os.path.join(list(m.__path__)[0], "lib"))' 2>/dev/null)
  [ -f "$cudnn_dir/libcudnn.so.9" ] ||
    cudnn_dir=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))' 2>/dev/null)
  if [ -f "$cudnn_dir/libcudnn.so.9" ]; then libs=$libs:$cudnn_dir; else echo "warning: libcudnn.so.9 not found"; fi
fi
export LD_LIBRARY_PATH=${libs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_btl_vader_single_copy_mechanism=none
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm --format=csv
"$bin/bottle" --version || failed+=(version)
# The cuDNN bottle loaded, as a run's first line says it ("attention: cuDNN 9.x.y SDPA (...)").
"$bin/bottle" bench step --backend cuda --precision bf16 --kinds none --vocab 256 --hidden 256 \
  --ffn 512 --layers 1 --heads 4 --batch 1 --seq 128 --steps 1 --warmup 0 --torch false 2>&1 |
  grep -E '^attention:|rror' || failed+=(cudnn_version)

step "1. every op against the reference backend"
check device_ops env BOTTLE_CUDA_SYNC=1 "$device_ops" cuda
grep -E '^\[ +(OK|FAILED|SKIPPED) +\]' "$out/device_ops.log" | sed 's/^/  /'

step "2. the whole model against the cpu backend"
check model_backends "$model_backends" cuda
grep -E 'vs cpu' "$out/model_backends.log" | sed 's/^/  /'

step "3. bottle train on the GPU"
data=/tmp/gpu-check-data
rm -rf "$data" /tmp/gpu-check-runs
mkdir -p "$data"
# Any text will do: the Python standard library's sources (a file is a document), byte-level
# tokens.
mapfile -t corpus < <(find /usr/lib/python3* -name '*.py' -size -64k 2>/dev/null | sort | head -n 600)
"$bin/bottle" prepare --input "${corpus[@]}" --output "$data" >"$out/prepare.log" 2>&1 ||
  failed+=(prepare)
run_train() {  # run_train NAME NP BACKEND COMM TP
  local name=$1 np=$2 backend=$3 comm=$4 tp=$5
  check "train_$name" mpirun -np "$np" --oversubscribe "$bin/bottle" train configs/tiny.toml \
    --set "data.train=$data/data_train_*.bin" --set "data.val=$data/data_val_*.bin" \
    --set training.steps=40 --set training.eval_interval=0 --set checkpoint.interval=0 \
    --set metrics.log_freq=1 --set metrics.plot= --set "checkpoint.folder=/tmp/gpu-check-runs/$name" \
    --set "training.backend=$backend" --set "parallel.comm=$comm" --set "parallel.tp=$tp"
}
run_train cpu 1 cpu mpi 1
run_train cuda_tp1 1 cuda mpi 1
run_train cuda_tp2_mpi 2 cuda mpi 2
run_train cuda_nccl 1 cuda nccl 1
python3 - /tmp/gpu-check-runs <<'EOF' | tee "$out/train_losses.txt"
import json, sys, os
root = sys.argv[1]
runs = ["cpu", "cuda_tp1", "cuda_tp2_mpi", "cuda_nccl"]
loss = {}
for r in runs:
    path = os.path.join(root, r, "metrics.jsonl")
    if os.path.exists(path):
        rows = [json.loads(l) for l in open(path) if l.strip()]
        loss[r] = {row["step"]: row["loss"] for row in rows if "loss" in row and "step" in row}
print("step " + " ".join(f"{r:>13}" for r in runs))
for s in (1, 2, 5, 10, 20, 30, 40):
    print(f"{s:4d} " + " ".join(f"{loss.get(r, {}).get(s, float('nan')):13.6f}" for r in runs))
ok = True
for r in runs[1:]:
    if "cpu" not in loss or r not in loss:
        print(f"{r}: missing"); ok = False; continue
    worst = max(abs(loss[r][s] - loss["cpu"][s]) / loss["cpu"][s] for s in loss["cpu"] if s in loss[r])
    print(f"{r} vs cpu: worst relative loss difference over the run {worst:.2e}")
    ok &= worst < 2e-2
sys.exit(0 if ok else 1)
EOF
[ "${PIPESTATUS[0]}" = 0 ] || failed+=(train_losses)

step "3b. bf16 training through the tensor-core attention and cuDNN's (head dims 128 and 64), cuda against cpu"
for spec in "cola 512" "none 256"; do
  read -r kind width <<<"$spec"
  # cuda: the own (tensor-core) attention; cuda_cudnn: cuDNN's SDPA, or the run fails saying why.
  for run in cpu cuda cuda_cudnn; do
    backend=${run%_cudnn} attention=own
    [ "$run" = cuda_cudnn ] && attention=cudnn
    [ "$run" = cpu ] && attention=auto
    check "train_bf16_${kind}_$run" "$bin/bottle" train configs/tiny.toml \
      --set "data.train=$data/data_train_*.bin" --set "data.val=$data/data_val_*.bin" \
      --set training.steps=30 --set training.eval_interval=0 --set checkpoint.interval=0 \
      --set metrics.plot= --set "checkpoint.folder=/tmp/gpu-check-runs/bf16-$kind-$run" \
      --set model.bottleneck="$kind" --set model.hidden_size="$width" --set model.num_heads=4 \
      --set model.intermediate_size=$((2 * width)) --set model.rank=$((width / 4)) \
      --set training.precision=bf16 --set training.backend="$backend" \
      --set training.attention="$attention"
    grep -m1 '^attention:' "$out/train_bf16_${kind}_$run.log" | sed "s/^/  $kind $run: /"
  done
done
python3 - /tmp/gpu-check-runs <<'EOF2' | tee "$out/train_bf16_losses.txt"
import json, os, sys
ok = True
for kind in ("cola", "none"):
    loss = {}
    for run in ("cpu", "cuda", "cuda_cudnn"):
        path = os.path.join(sys.argv[1], f"bf16-{kind}-{run}", "metrics.jsonl")
        loss[run] = [json.loads(l)["loss"] for l in open(path) if '"loss"' in l] if os.path.exists(path) else []
    for run in ("cuda", "cuda_cudnn"):
        if not loss["cpu"] or len(loss["cpu"]) != len(loss[run]):
            print(f"{kind} {run}: missing"); ok = False; continue
        worst = max(abs(a - b) / b for a, b in zip(loss[run], loss["cpu"]))
        print(f"{kind} bf16 {run}: {len(loss['cpu'])} steps, cpu {loss['cpu'][0]:.4f} -> {loss['cpu'][-1]:.4f}, "
              f"{run} {loss[run][0]:.4f} -> {loss[run][-1]:.4f}; worst relative difference {worst:.2e}")
        ok &= worst < 2e-2
sys.exit(0 if ok else 1)
EOF2
[ "${PIPESTATUS[0]}" = 0 ] || failed+=(train_bf16_losses)

if [ "$bench" = 1 ]; then
  step "4. bench step, bf16, CoLA-1B-like and its full-rank twin, with PyTorch on the GPU"
  check bench "$bin/bottle" bench step --backend cuda --precision bf16 --kinds cola,none \
    --vocab 32000 --hidden 2048 --ffn 5472 --layers 24 --heads 16 --rank 512 --batch 4 \
    --seq 2048 --steps 5 --warmup 2 --peak-tflops 989 --torch true --torch-compile
  cat "$out/bench.log"
fi

step "summary"
if [ ${#failed[@]} -eq 0 ]; then
  echo "gpu check: every step passed in $((SECONDS - start)) s"
else
  echo "gpu check: FAILED: ${failed[*]} ($((SECONDS - start)) s)"
  exit 1
fi
