#!/usr/bin/env bash
# tests/cluster/faults.sh BOTTLE: faults of a whole host in a 4-rank training job across two
# emulated nodes (tools/cluster/cluster.sh; 2 nodes x 2 ranks, tp 2 x dp 2, the TP pairs
# within a node, the DP all-reduce across the 1 Gbit/s + 200 us link). Each fault hits node 1
# after the run's checkpoint of step 40:
#   kill   every process of node 1 (its ranks and Open MPI's daemon) is killed (SIGKILL);
#   cut    node 1's links go down (it reaches no one, no one reaches it);
#   disk   the checkpoint folder, on a small tmpfs, fills during a save;
#   pause  node 1 is stopped (cluster.sh stop: SIGSTOP) for 30 s, then continued, under
#          parallel.comm_timeout = 120: the job goes on, to the same bits as without the pause;
#   stall  node 1 is stopped for good (a hung host) under parallel.comm_timeout = 8: the job
#          ends within 8 + 10 s, naming the rank and host it waited for; mpirun, which would
#          wait for node 1's daemon forever, is ended by the launcher guard of its own rank.
# For each but pause: the job ends non-zero within a bound, with a message naming node 1 (its host
# name, or its address, 198.18.X.1, where Open MPI names it); the newest complete checkpoint
# is bit for bit the uninterrupted run's of the same step; and --resume on the remaining
# node alone (tp 2 x dp 1 x 2 accumulation steps: the same global batch) trains to the end,
# to the very bits a resume of the uninterrupted run's checkpoint gives on that layout, and
# within 1e-4 relative of the uninterrupted 4-rank run's losses.
# Skips (77) where namespaces cannot be made (and the disk case alone where tmpfs cannot be
# mounted); fails without MPI. About 2 minutes.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
steps=200
bottle_and_tiny_model "${1:-}" 400
cat >>"$work/tiny.toml" <<EOF
[training]
steps = $steps
micro_batch_size = 2
seq_len = 16
eval_interval = 0

[optimizer]
lr = 1e-3

[data]
train = "$work/data/data_train_*.bin"

[checkpoint]
interval = 20
keep = 100

[metrics]
log_freq = 1

[parallel]
tp = 2
EOF

p=${tag}f
own "$p"
state=$work/cluster
"$cluster" up --state "$state" --prefix "$p" --nodes 2 --ranks-per-node 2 \
  --inter 1gbit,200us 2>/dev/null || fail "up $p"
mapfile -t addresses < <(awk '{ print $1 }' "$state/hosts")
mapfile -t names < <(awk '{ print $2 }' "$state/hosts")
node1="(${names[2]}|${names[3]}|${addresses[2]}|${addresses[3]})"

# start FOLDER [SETS...]: the 4-rank job (tp 2 x dp 2) in the background, its output in
# FOLDER.log (or $log); its pid in $job.
start() {
  local folder=$1
  shift
  timeout -k 5 300 "$cluster" run --state "$state" -- -np 4 "$bottle" train "$work/tiny.toml" \
    --set parallel.dp=2 --set checkpoint.folder="$folder" "$@" >"${log:-$folder.log}" 2>&1 &
  job=$!
}
# resume FOLDER: --resume on node 0 alone (tp 2 x dp 1, 2 accumulation steps), to the end.
resume() {
  timeout -k 5 300 "$cluster" run --state "$state" -- -np 2 --host "${addresses[0]},${addresses[1]}" \
    "$bottle" train "$work/tiny.toml" --set parallel.dp=1 --set training.grad_accum_steps=2 \
    --set checkpoint.folder="$1" --resume >"$1.resume.log" 2>&1 ||
    fail "resume of $1 on node 0: $(tail -n 5 "$1.resume.log")"
}
# The newest complete checkpoint's step in FOLDER (0: none).
newest() {
  local d
  d=$(find "$1" -maxdepth 2 -name bottle_checkpoint -path '*/step_*' -printf '%h\n' | sort | tail -n 1)
  [[ -n $d ]] && echo $((10#${d##*step_})) || echo 0
}
step_dir() { printf '%s/step_%08d' "$1" "$2"; }
# Waits until FOLDER holds the checkpoint of step N, or fails.
await_checkpoint() {
  local i
  for ((i = 0; i < 600; i++)); do
    [[ -e $(step_dir "$1" "$2")/bottle_checkpoint ]] && return 0
    kill -0 "$job" 2>/dev/null || fail "the job ended before step $2: $(tail -n 5 "$1.log")"
    sleep 0.1
  done
  fail "no checkpoint of step $2 in 60 s: $(tail -n 5 "$1.log")"
}
# Seconds since $fault_at, to one decimal.
since_fault() {
  awk -v s="$fault_at" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f", n - s }'
}
# Waits for the job; fails unless it ended non-zero within LIMIT seconds of $fault_at (a job
# still running then is left to the trap, which takes the cluster down). Sets $took to the
# seconds it took.
await_end() {
  local limit=$1 status=0
  while kill -0 "$job" 2>/dev/null; do
    awk -v t="$(since_fault)" -v l="$limit" 'BEGIN { exit !(t > l) }' &&
      fail "$2: the job was still running $limit s after the fault: $(tail -n 5 "$work/$2.log" 2>/dev/null)"
    sleep 0.1
  done
  wait "$job" || status=$?
  took=$(since_fault)
  ((status != 0)) || fail "$2: the job exited 0"
  ((status != 124)) || fail "$2: the job hung (ended by timeout after 300 s)"
}
# The safetensors of a checkpoint (the model and the optimizer), the same bytes or fail.
same_checkpoint() {
  local a=$1 b=$2 f
  for f in "$a"/*.safetensors; do
    cmp -s "$f" "$b/$(basename "$f")" || fail "$(basename "$f") of $a differs from $b's"
  done
}
# The losses of metrics.jsonl's steps above K, one a line ("step loss"; its keys are sorted).
losses_after() {
  sed -n 's/.*"loss":\([^,]*\),.*"step":\([0-9]*\),.*/\2 \1/p' "$1/metrics.jsonl" |
    awk -v k="$2" '$1 > k'
}
# The largest relative difference between the losses of two "step loss" lists.
worst_difference() {
  awk 'NR == FNR { want[$1] = $2; next }
       ($1 in want) { d = ($2 - want[$1]) / want[$1]; if (d < 0) d = -d; if (d > w) w = d; n++ }
       END { if (!n) print "none"; else printf "%.1e", w }' "$1" "$2"
}

# The uninterrupted run, its checkpoints every 20 steps kept.
start "$work/ref"
wait "$job" || fail "the uninterrupted run: $(tail -n 5 "$work/ref.log")"
[[ -e $(step_dir "$work/ref" "$steps")/bottle_checkpoint ]] || fail "the uninterrupted run saved no step $steps"

# check NAME: after a fault, the newest complete checkpoint is the uninterrupted run's, and
# the resume on node 0 continues to the bits of the uninterrupted checkpoint's resume there.
check() {
  local name=$1 folder=$work/$1 since=${2:-the fault} k ref_k
  k=$(newest "$folder")
  ((k >= 40)) || fail "$name: the newest complete checkpoint is step $k, not 40 or later"
  same_checkpoint "$(step_dir "$folder" "$k")" "$(step_dir "$work/ref" "$k")"
  ref_k=$work/ref_from_$k
  if [[ ! -d $ref_k ]]; then
    cp -a "$work/ref" "$ref_k"
    find "$ref_k" -maxdepth 1 -name 'step_*' | while read -r d; do
      ((10#${d##*step_} <= k)) || rm -rf "$d"
    done
    resume "$ref_k"
  fi
  resume "$folder"
  same_checkpoint "$(step_dir "$folder" "$steps")" "$(step_dir "$ref_k" "$steps")"
  diff <(losses_after "$folder" "$k") <(losses_after "$ref_k" "$k") >/dev/null ||
    fail "$name: the resumed losses differ from those of the uninterrupted checkpoint's resume"
  worst=$(worst_difference <(losses_after "$work/ref" "$k") <(losses_after "$folder" "$k"))
  awk -v w="$worst" 'BEGIN { exit !(w != "none" && w <= 1e-4) }' ||
    fail "$name: resumed at 2 ranks, the losses are $worst relative from the 4-rank run's"
  note "$name: ended in $took s after $since; step $k survived bit for bit; resumed on node 0" \
    "(tp 2 x dp 1) to step $steps: the bits of the uninterrupted checkpoint's resume," \
    "$worst relative from the 4-rank losses ($(elapsed))"
}

# 1. kill every process of node 1.
start "$work/kill"
await_checkpoint "$work/kill" 40
fault_at=$(date +%s.%N)
"$cluster" pids --state "$state" --node 1 | xargs -r kill -KILL
await_end 30 kill
grep -Eq "$node1" "$work/kill.log" || fail "kill: no message names node 1: $(tail -n 20 "$work/kill.log")"
check kill

# 2. cut node 1's links: mpirun notices the lost host by its keepalives (cluster.sh's env.sh).
start "$work/cut"
await_checkpoint "$work/cut" 40
fault_at=$(date +%s.%N)
"$cluster" cut --state "$state" --node 1
await_end 60 cut
grep -Eq "$node1" "$work/cut.log" || fail "cut: no message names node 1: $(tail -n 20 "$work/cut.log")"
# Node 1, alone, ends its own processes once it knows it lost mpirun.
for ((i = 0; i < 300; i++)); do
  [[ -z $("$cluster" pids --state "$state" --node 1) ]] && break
  sleep 0.1
done
left=$("$cluster" pids --state "$state" --node 1 | xargs)
"$cluster" pids --state "$state" --node 1 | xargs -r kill -KILL
"$cluster" heal --state "$state"
[[ -z $left ]] || note "cut: node 1's processes $left were still there 30 s after the job's end (killed)"
check cut

# 3. pause node 1 for 30 s: below parallel.comm_timeout the job goes on, to the same bits.
start "$work/pause" --set parallel.comm_timeout=120
await_checkpoint "$work/pause" 40
"$cluster" stop --state "$state" --node 1
sleep 30
"$cluster" cont --state "$state" --node 1
wait "$job" || fail "pause: the job paused 30 s failed: $(tail -n 5 "$work/pause.log")"
same_checkpoint "$(step_dir "$work/pause" "$steps")" "$(step_dir "$work/ref" "$steps")"
diff <(losses_after "$work/pause" 0) <(losses_after "$work/ref" 0) >/dev/null ||
  fail "pause: the losses differ from the uninterrupted run's"
note "pause: node 1 stopped 30 s under parallel.comm_timeout = 120: the run finished, its losses" \
  "and checkpoint bit for bit the uninterrupted run's ($(elapsed))"

# ... and above it the job ends, naming node 1's rank and host, even though node 1 stays
# stopped: mpirun, whose daemon there never answers, would wait for it forever; the launcher
# guard of rank 0 (mpirun's child) ends it 5 s after rank 0 is gone.
start "$work/stall" --set parallel.comm_timeout=8
await_checkpoint "$work/stall" 40
fault_at=$(date +%s.%N)
"$cluster" stop --state "$state" --node 1
for ((i = 0; i < 300; i++)); do
  grep -q "made no progress" "$work/stall.log" && break
  sleep 0.1
done
said=$(since_fault)
await_end $((8 + 10)) stall
grep -Eq "made no progress for 8 s, waiting for its rank [0-9]+ \(world rank [23] on ${names[2]}|made no progress for 8 s, waiting for its rank [0-9]+ \(world rank [23] on ${names[3]}" \
  "$work/stall.log" || fail "stall: no message names the stopped rank and host: $(grep error "$work/stall.log")"
grep -q "ending mpirun (SIGKILL)" "$work/stall.log" ||
  fail "stall: mpirun ended, but not by the launcher guard: $(tail -n 5 "$work/stall.log")"
note "stall: $(grep -m1 -o 'rank [0-9] (world rank [0-9] on [^)]*) of the .*waiting for its rank [^)]*)' "$work/stall.log")"
note "stall: said after $said s; mpirun ended $took s after node 1 was stopped, node 1 still stopped"
# Node 1's processes, stopped since, are the frozen job's; the cases below need the node.
"$cluster" pids --state "$state" --node 1 | xargs -r kill -KILL
"$cluster" cont --state "$state" --node 1
check stall

# 4. the checkpoint folder's disk fills during a save (tmpfs: room for two checkpoints).
disk=$work/disk
mkdir -p "$disk"
if ! mount -t tmpfs -o size=1300k "$p-disk" "$disk" 2>/dev/null; then
  note "disk: skipped: cannot mount a tmpfs here (not root, or no permission in this container)"
else
  cleanup_disk() { umount "$disk" 2>/dev/null || umount -l "$disk" 2>/dev/null || true; }
  trap 'cleanup_disk; cleanup' EXIT
  log=$work/disk_run.log start "$disk/run"
  fault_at=$(date +%s.%N)
  await_end 60 disk
  grep -Eiq "no space left on device" "$work/disk_run.log" ||
    fail "disk: the error does not say the disk is full: $(grep -i error "$work/disk_run.log" | head -n 3)"
  note "disk: $(grep -m1 -i 'error' "$work/disk_run.log")"
  # What the cut save wrote stays under its temporary name (the next save clears it), so
  # every step folder is whole.
  for d in "$disk"/run/step_*; do
    [[ -e $d/bottle_checkpoint && -e $d/trainer_state.json ]] || fail "disk: $d is not whole"
  done
  cp -a "$disk/run" "$work/disk_run"
  cleanup_disk
  check disk_run "its start"
fi
"$cluster" down --state "$state" || fail "down $p"
assert_clean "$p"
note "all faults passed ($(elapsed))"
