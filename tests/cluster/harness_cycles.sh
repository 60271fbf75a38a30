#!/usr/bin/env bash
# tests/cluster/harness_cycles.sh: the cluster harness (tools/cluster/cluster.sh) leaves
# nothing behind and keeps clusters apart:
#   1. 20 ups and downs in a row of 2 nodes x 2 ranks (shaped; every fifth with latency, so
#      through the delay switch where the kernel has no sch_netem), after which no namespace
#      and no root-namespace link of the harness is left;
#   2. two clusters up side by side (distinct prefixes and subnets), each running an MPI job
#      at the same time whose ranks all live in their own cluster, then both taken down;
#   3. `cluster.sh with` whose command (an mpirun job) is still running when the `with`
#      process gets SIGTERM: it exits 143 and removes the cluster, its processes and its
#      state directory;
#   4. `cluster.sh with` whose command stops node 1 (`cluster.sh stop`, as a hung host) and
#      ends: `with` says the command ended while node 1 was stopped, exits with the command's
#      status, and its down ends the stopped process too.
# Skips (77) where namespaces cannot be made; 10 to 18 s on 2 cores.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"

# 1. Cycles.
prefix=${tag}a
own "$prefix"
for ((i = 1; i <= 20; i++)); do
  links=(--intra 1gbit --inter 200mbit)
  # shellcheck disable=SC2054 # BANDWIDTH,LATENCY is one argument
  ((i % 5)) || links=(--intra 1gbit,50us --inter 200mbit,500us)
  "$cluster" up --state "$work/cycle" --prefix "$prefix" --nodes 2 --ranks-per-node 2 \
    "${links[@]}" 2>/dev/null || fail "up, cycle $i"
  count=$(ip netns list | grep -c -E "^$prefix-" || true)
  ((count == 5)) || fail "cycle $i: $count namespaces of $prefix, not 5 (4 ranks and the switch)"
  "$cluster" down --state "$work/cycle" || fail "down, cycle $i"
  [[ ! -e $work/cycle/config ]] || fail "cycle $i: down left the config"
done
"$cluster" down --state "$work/cycle" || fail "a second down is not a no-op"
assert_clean "$prefix"
note "20 up/down cycles of 2 x 2: nothing left ($(elapsed))"

# 2. Two clusters side by side, each running a job at once.
build_pingpong
a=${tag}b b=${tag}c
own "$a"
own "$b"
"$cluster" up --state "$work/a" --prefix "$a" --nodes 2 --ranks-per-node 2 --inter 500mbit \
  2>/dev/null &
up_a=$!
"$cluster" up --state "$work/b" --prefix "$b" --nodes 2 --ranks-per-node 2 --inter 500mbit \
  2>/dev/null &
up_b=$!
wait "$up_a" || fail "up $a"
wait "$up_b" || fail "up $b"
subnet_a=$(awk -F= '$1 == "subnet" { print $2 }' "$work/a/config")
subnet_b=$(awk -F= '$1 == "subnet" { print $2 }' "$work/b/config")
[[ $subnet_a != "$subnet_b" ]] || fail "both clusters on $subnet_a"
timeout 120 "$cluster" run --state "$work/a" -- -np 4 "$work/pingpong" 2 >"$work/a.out" 2>&1 &
job_a=$!
timeout 120 "$cluster" run --state "$work/b" -- -np 4 "$work/pingpong" 2 >"$work/b.out" 2>&1 &
job_b=$!
wait "$job_a" || fail "the job on $a: $(cat "$work/a.out")"
wait "$job_b" || fail "the job on $b: $(cat "$work/b.out")"
for side in a b; do
  prefix=${!side}
  hosts=$(awk '$1 == "rank" { print $6 }' "$work/$side.out" | sort | xargs)
  expected="$prefix-n0r0 $prefix-n0r1 $prefix-n1r0 $prefix-n1r1"
  [[ $hosts == "$expected" ]] || fail "the ranks of $prefix ran on: $hosts"
  [[ -n $(value bandwidth_mbit "$work/$side.out") ]] || fail "no result on $prefix"
done
"$cluster" down --state "$work/a" || fail "down $a"
"$cluster" down --state "$work/b" || fail "down $b"
assert_clean "$a"
assert_clean "$b"
note "two clusters side by side ($subnet_a, $subnet_b), a 4-rank job on each at once:" \
  "$(value bandwidth_mbit "$work/a.out") and $(value bandwidth_mbit "$work/b.out") Mbit/s;" \
  "both removed ($(elapsed))"

# 3. A `with` killed while its job runs.
k=${tag}k
own "$k"
mkdir "$work/with"
TMPDIR=$work/with "$cluster" with --prefix "$k" --nodes 2 -- \
  "$cluster" run -- -np 2 sleep 300 >"$work/with.out" 2>&1 &
with=$!
pids=""
for ((i = 0; i < 200; i++)); do
  pids=$(for ns in "$k-n0r0" "$k-n1r0"; do ip netns pids "$ns" 2>/dev/null || true; done | xargs)
  # mpirun and a sleep in node 0; the orted and a sleep in node 1.
  [[ $(wc -w <<<"$pids") -ge 4 ]] && break
  sleep 0.1
done
[[ $(wc -w <<<"$pids") -ge 4 ]] || fail "the job under with did not start: $(cat "$work/with.out")"
kill -TERM "$with"
status=0
wait "$with" || status=$?
((status == 143)) || fail "with exited $status after SIGTERM, not 143: $(cat "$work/with.out")"
# A process is gone once it has left /proc or is a zombie (init reaps the orphans).
running() {
  local state
  state=$(awk '{ sub(/.*\) /, ""); print $1 }' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n $state && $state != Z ]]
}
for pid in $pids; do
  for ((i = 0; i < 20; i++)); do running "$pid" || break; sleep 0.1; done
  ! running "$pid" || fail "process $pid of the killed job is still running"
done
assert_clean "$k"
[[ -z $(ls -A "$work/with") ]] || fail "with left its state directory: $(ls "$work/with")"
note "with killed by SIGTERM: exit 143, cluster, job and state removed ($(elapsed))"

# 4. A `with` whose command ends while a node is stopped.
h=${tag}h
own "$h"
mkdir "$work/stopped"
status=0
# shellcheck disable=SC2016 # expanded by the inner bash
TMPDIR=$work/stopped "$cluster" with --prefix "$h" --nodes 2 -- bash -c '
  "$1" exec --rank 1 -- setsid sleep 300 &
  for ((i = 0; i < 100; i++)); do [[ -n $("$1" pids --node 1) ]] && break; sleep 0.1; done
  "$1" pids --node 1 >"$2"
  "$1" stop --node 1
  exit 3' with "$cluster" "$work/stopped.pids" >"$work/stopped.out" 2>&1 || status=$?
((status == 3)) || fail "with exited $status, not its command's 3: $(cat "$work/stopped.out")"
grep -Eq "^cluster.sh: the command ended \(status 3\) [0-9.]+ s after node 1 was stopped" \
  "$work/stopped.out" || fail "with did not say node 1 was stopped: $(cat "$work/stopped.out")"
[[ -s $work/stopped.pids ]] || fail "no process ran in node 1"
while read -r pid; do
  ! running "$pid" || fail "the stopped process $pid outlived with's down"
done <"$work/stopped.pids"
assert_clean "$h"
[[ -z $(ls -A "$work/stopped") ]] || fail "with left its state directory: $(ls "$work/stopped")"
note "with whose command stopped node 1: $(grep -m1 -o 'the command ended.*stopped' "$work/stopped.out");" \
  "stopped process ended, cluster removed ($(elapsed))"
