#!/usr/bin/env bash
# tests/cluster/harness_mpi.sh: Open MPI jobs across the cluster harness's emulated hosts
# (tools/cluster/cluster.sh) cross the links it shapes, and nothing else:
#   1. 2 nodes x 1 rank, inter-node link 200 Mbit/s + 1 ms: each rank runs in its own network
#      namespace (ip netns identify, and pingpong's /proc/self/ns/net) under its host name;
#      pingpong's 1 MiB messages measure 0.3x to 1.3x the shaped bandwidth (the median
#      round trip at least 0.3x, the fastest at most 1.3x) and its 8-byte messages the shaped
#      one-way latency: the fastest round trip at least the delay and at most 1 ms more, the
#      median at least the delay (the rest is waiting for a core on a busy machine); rank 0's
#      inter-node HTB class counted the megabytes;
#   2. 2 nodes x 2 ranks, intra-node 1 Gbit/s + 100 us, inter-node 200 Mbit/s + 1 ms: a pair
#      on one node measures the intra-node tier (fastest latency >= 100 us and below the
#      inter-node pair's; bandwidth twice the inter-node pair's or more), a pair across nodes
#      the inter-node tier;
#   3. cut node 1: a TCP connection from node 0 to it hangs (was refused at once before);
#      heal: refused at once again; pids lists a process started in node 1.
# Skips (77) where namespaces cannot be made; fails without mpicc and mpirun. About 7 s.
# shellcheck source-path=SCRIPTDIR source=lib.sh
source "$(dirname "$0")/lib.sh"
build_pingpong

# The inode of a namespace's file, as pingpong prints it.
ns_inode() {
  stat -L -c %i "/run/netns/$1"
}

# within LABEL VALUE LOW HIGH: fails unless LOW <= VALUE <= HIGH.
within() {
  awk -v v="$2" -v lo="$3" -v hi="$4" 'BEGIN { exit !(v != "" && v >= lo && v <= hi) }' ||
    fail "$1 is ${2:-missing}, not in [$3, $4]"
}

# 1. 2 nodes x 1 rank across one shaped link.
p=${tag}m
own "$p"
state=$work/one
"$cluster" up --state "$state" --prefix "$p" --nodes 2 --ranks-per-node 1 \
  --inter 200mbit,1ms 2>/dev/null || fail "up $p"
# shellcheck disable=SC2016 # expanded by each rank's shell
timeout 60 "$cluster" run --state "$state" -- -np 2 \
  sh -c 'echo "$OMPI_COMM_WORLD_RANK $(ip netns identify $$) $(hostname)"' >"$work/identify.out" ||
  fail "mpirun of ip netns identify: $(cat "$work/identify.out")"
[[ $(sort "$work/identify.out" | xargs) == "0 $p-n0r0 $p-n0r0 1 $p-n1r0 $p-n1r0" ]] ||
  fail "ranks, namespaces and host names: $(xargs <"$work/identify.out")"
timeout 60 "$cluster" run --state "$state" -- -np 2 "$work/pingpong" 1 >"$work/one.out" 2>&1 ||
  fail "pingpong: $(cat "$work/one.out")"
for r in 0 1; do
  inode=$(awk -v r="$r" '$1 == "rank" && $2 == r { print $4 }' "$work/one.out")
  [[ $inode == "$(ns_inode "$p-n${r}r0")" ]] || fail "rank $r is not in namespace $p-n${r}r0"
done
bandwidth=$(value bandwidth_mbit "$work/one.out")
latency=$(value latency_min_us "$work/one.out")
within "median bandwidth (Mbit/s) over 200mbit,1ms" "$bandwidth" 60 1e9
within "best bandwidth (Mbit/s) over 200mbit,1ms" "$(value bandwidth_max_mbit "$work/one.out")" 60 260
within "fastest latency (us) over 200mbit,1ms" "$latency" 1000 2000
within "median latency (us) over 200mbit,1ms" "$(value latency_us "$work/one.out")" 1000 1e9
sent=$(tc -n "$p-n0r0" -s class show dev eth0 | awk '/^class htb 1:20/ { c = 1 } c && /Sent/ { print $2; exit }')
within "bytes rank 0 sent through its inter-node class" "$sent" 8000000 1e12
"$cluster" down --state "$state" || fail "down $p"
assert_clean "$p"
note "2 x 1 over 200mbit,1ms: $bandwidth Mbit/s (median), $latency us one way (fastest);" \
  "ranks in their namespaces; $sent bytes through the inter-node class ($(elapsed))"

# 2. Two tiers.
p=${tag}t
own "$p"
state=$work/two
"$cluster" up --state "$state" --prefix "$p" --nodes 2 --ranks-per-node 2 \
  --intra 1gbit,100us --inter 200mbit,1ms 2>/dev/null || fail "up $p"
mapfile -t hosts < <(awk '{ print $1 }' "$state/hosts")
timeout 60 "$cluster" run --state "$state" -- -np 2 --host "${hosts[0]},${hosts[1]}" \
  "$work/pingpong" 1 >"$work/intra.out" 2>&1 || fail "intra-node pingpong: $(cat "$work/intra.out")"
timeout 60 "$cluster" run --state "$state" -- -np 2 --host "${hosts[0]},${hosts[2]}" \
  "$work/pingpong" 1 >"$work/inter.out" 2>&1 || fail "inter-node pingpong: $(cat "$work/inter.out")"
grep -q "host $p-n0r1\$" "$work/intra.out" || fail "the intra-node pair: $(cat "$work/intra.out")"
grep -q "host $p-n1r0\$" "$work/inter.out" || fail "the inter-node pair: $(cat "$work/inter.out")"
intra_bw=$(value bandwidth_max_mbit "$work/intra.out")
intra_lat=$(value latency_min_us "$work/intra.out")
inter_bw=$(value bandwidth_max_mbit "$work/inter.out")
inter_lat=$(value latency_min_us "$work/inter.out")
within "best inter-node bandwidth (Mbit/s)" "$inter_bw" 60 260
within "fastest inter-node latency (us)" "$inter_lat" 1000 2000
within "best intra-node bandwidth (Mbit/s)" "$intra_bw" "$(awk -v b="$inter_bw" 'BEGIN { print 2 * b }')" 1300
within "fastest intra-node latency (us)" "$intra_lat" 100 "$inter_lat"
note "2 x 2 (best bandwidth, fastest latency), intra 1gbit,100us: $intra_bw Mbit/s," \
  "$intra_lat us; inter 200mbit,1ms: $inter_bw Mbit/s, $inter_lat us ($(elapsed))"

# 3. Cut and heal node 1; pids.
# connect_status: bash's exit status for a TCP connection from rank 0 to rank 2's port 9
# (nothing listens: refused at once, status 1) within 2 s (124: no answer).
connect_status() {
  local status=0
  timeout 2 "$cluster" exec --state "$state" --rank 0 -- \
    bash -c "exec 3<>/dev/tcp/${hosts[2]}/9" 2>/dev/null || status=$?
  echo "$status"
}
[[ $(connect_status) == 1 ]] || fail "before the cut, node 1 does not refuse a connection"
"$cluster" cut --state "$state" --node 1
[[ $(connect_status) == 124 ]] || fail "after the cut, node 1 still answers"
"$cluster" heal --state "$state"
[[ $(connect_status) == 1 ]] || fail "after heal, node 1 does not refuse a connection"
"$cluster" exec --state "$state" --rank 3 -- sleep 60 &
sleeper=$!
for ((i = 0; i < 50; i++)); do
  listed=$("$cluster" pids --state "$state" --node 1 | xargs)
  [[ -n $listed ]] && break
  sleep 0.1
done
[[ " $listed " == *" $sleeper "* ]] || fail "pids --node 1 lists '$listed', not $sleeper"
[[ -z $("$cluster" pids --state "$state" --node 0) ]] || fail "pids --node 0 lists processes"
"$cluster" down --state "$state" || fail "down $p"
wait "$sleeper" 2>/dev/null || true
assert_clean "$p"
note "cut node 1: connections hang; heal: refused at once again; pids found the process" \
  "($(elapsed))"
