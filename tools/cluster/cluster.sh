#!/usr/bin/env bash
# tools/cluster/cluster.sh: a cluster of N hosts on one machine, for running real Open MPI
# jobs over TCP across emulated nodes (issue 43). Every rank gets a network namespace of its
# own ("host"); the namespaces hang off one switch in a namespace of the run's own, so the
# root namespace gains nothing. Each rank's egress is shaped in two tiers (HTB classes chosen
# by destination address): one for the ranks of its own node, one for every other node.
# docs/design.md §23 explains the layout; `cluster.sh help` lists the commands.
set -euo pipefail
export LC_ALL=C

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
self="$here/$(basename "${BASH_SOURCE[0]}")"
slots=32         # /20 subnets in 198.18.0.0/15 (RFC 2544's benchmarking range)
# What up (and stop) writes into the state directory besides $cluster_marker: down removes
# these names, and up refuses a state directory that holds any of them already (they would be a
# user's).
state_files=(config hosts hostfile agent env.sh delayswitch delayswitch.log tmp stopped stopped.new)

usage() {
  cat <<'EOF'
usage: cluster.sh COMMAND [OPTIONS]

  check                      exit 0 when clusters can be made here, else 77 and one line why
  up --state DIR [--nodes N] [--ranks-per-node R] [--intra LINK] [--inter LINK]
     [--prefix P] [--delay-by auto|netem|switch] [--mtu BYTES]
                             bring a cluster up; DIR receives .made-by-cluster, config,
                             hosts, hostfile, agent, env.sh, tmp/ and the delay switch's
                             files (none of these names may be there already)
  down [--state DIR | --prefix P]
                             remove everything of that cluster (idempotent): in DIR, only
                             what up made there
  run [--state DIR] -- MPIRUN-ARGS...
                             mpirun across the cluster, from rank 0's namespace
  exec [--state DIR] [--rank I] -- COMMAND...
                             COMMAND in rank I's namespace (default 0) with env.sh's settings
  with [UP OPTIONS] -- COMMAND...
                             up, COMMAND with BOTTLE_CLUSTER_STATE set, down (always);
                             exits with COMMAND's status (128+N after signal N)
  cut [--state DIR] --node K take node K's links down (its ranks reach no one)
  heal [--state DIR] [--node K]
                             bring node K's links (default: all) back up
  stop [--state DIR] --node K
                             stop every process of node K (SIGSTOP), as a hung host
  cont [--state DIR] [--node K]
                             continue node K's processes (default: all nodes')
  pids [--state DIR] [--node K]
                             the processes in node K's namespaces (default: all), one a line
  list                       prefixes of the clusters up on this machine

LINK is BANDWIDTH[,LATENCY] or none (the default): BANDWIDTH as 400mbit, 10gbit, 500kbit
(bits per second; "/s" may follow) or none; LATENCY (one way) as 100us, 1ms, 0.5ms or none.
--mtu: the links' MTU (1500 by default; 9000 as datacenter links' jumbo frames, which cut the
per-packet work this machine's CPUs do for the emulated links about sixfold).
--state defaults to $BOTTLE_CLUSTER_STATE (which `with` exports). Rank i lives on node
i / R; rank i of an mpirun job runs on rank i's host.
EOF
}

die() {
  printf 'cluster.sh: %s\n' "$*" >&2
  exit 1
}

# need_value, whole, parse_link (its bandwidths and latencies), max_nodes, max_ranks and
# cluster_marker, shared with the tools that run clusters.
# shellcheck source-path=SCRIPTDIR source=args.sh
. "$here/args.sh"

valid_prefix() {
  [[ $1 =~ ^[a-z][a-z0-9]{1,9}$ ]] || die "prefix '$1': 2 to 10 characters, a-z then a-z or 0-9"
}

# The namespaces of a prefix that exist now, one a line (exact names only: PREFIX-sw and
# PREFIX-nKrJ).
namespaces_of() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | grep -E "^$1-(sw|n[0-9]+r[0-9]+)\$" || true
}

# Reads the config of the state directory given (or of BOTTLE_CLUSTER_STATE): its variables,
# state included, land in the caller's locals. Only a config that up wrote (beside its marker)
# is read: a file of the same name that is not up's is no cluster, and sourcing it would run it.
load_state() {
  local dir=${1:-${BOTTLE_CLUSTER_STATE:-}}
  [[ -n $dir ]] || die "no --state DIR and no BOTTLE_CLUSTER_STATE"
  [[ -f $dir/$cluster_marker && -f $dir/config ]] ||
    die "$dir holds no cluster that is up (no $cluster_marker and config of cluster.sh up)"
  # shellcheck source=/dev/null
  . "$dir/config"
}

# ---------------------------------------------------------------------------------------
# check

check_probe=''
skip() {
  [[ -z $check_probe ]] || ip netns del "$check_probe" 2>/dev/null || true
  printf 'cluster.sh check: skip: %s\n' "$*"
  exit 77
}

cmd_check() {
  [[ $(id -u) == 0 ]] || skip "not root (network namespaces need CAP_NET_ADMIN and CAP_SYS_ADMIN)"
  local tool
  for tool in ip tc awk unshare flock setsid hostname; do
    command -v "$tool" >/dev/null || skip "no $tool"
  done
  local probe="bclchk$$"
  mkdir -p /run/netns 2>/dev/null || skip "cannot create /run/netns"
  ip netns add "$probe" 2>/dev/null || skip "cannot create a network namespace (no CAP_NET_ADMIN?)"
  check_probe=$probe
  ip netns exec "$probe" true 2>/dev/null || skip "ip netns exec fails (no CAP_SYS_ADMIN?)"
  ip -n "$probe" link add probe0 type veth peer name probe1 2>/dev/null || skip "no veth pairs"
  ip -n "$probe" link add br0 type bridge 2>/dev/null || skip "no bridges"
  tc -n "$probe" qdisc add dev probe0 root handle 1: htb default 0 2>/dev/null || skip "no sch_htb"
  tc -n "$probe" filter add dev probe0 parent 1: protocol ip prio 1 u32 match ip dst 0.0.0.0/0 \
    flowid 1:0 2>/dev/null || skip "no cls_u32"
  local latency
  if tc -n "$probe" qdisc add dev probe1 root netem delay 1ms 2>/dev/null; then
    latency="latency by sch_netem"
  elif command -v cc >/dev/null; then
    latency="latency by the delay switch (no sch_netem in this kernel)"
  else
    latency="no latency emulation (no sch_netem and no cc to build the delay switch)"
  fi
  ip netns del "$probe"
  echo "cluster.sh check: ok: namespaces, veth, bridge, htb, u32; $latency"
}

# ---------------------------------------------------------------------------------------
# up

# A fresh prefix: "bcl" and 5 hex digits from the pid and $RANDOM.
new_prefix() {
  printf 'bcl%05x\n' $(((($$ << 7) ^ (RANDOM << 3) ^ RANDOM) & 0xfffff))
}

# The slot of an address in 198.18.0.0/15 (the /20 it falls in), or nothing.
slot_of() {
  awk -F. '$1 == 198 && ($2 == 18 || $2 == 19) { print ($2 - 18) * 16 + int($3 / 16) }' <<<"$1"
}

# A /20 slot no other cluster's rank 0 uses, starting from one derived from the prefix.
free_slot() {
  local used=" " ns address slot start i
  while read -r ns; do
    address=$(ip -n "$ns" -4 -o addr show dev eth0 2>/dev/null | awk '{ print $4 }' | head -n 1)
    slot=$(slot_of "${address%/*}")
    [[ -n $slot ]] && used+="$slot "
  done < <(ip netns list 2>/dev/null | awk '$1 ~ /-n0r0$/ { print $1 }')
  start=$(($(cksum <<<"$1" | cut -d' ' -f1) % slots))
  for ((i = 0; i < slots; i++)); do
    slot=$(((start + i) % slots))
    [[ $used == *" $slot "* ]] || { echo "$slot"; return; }
  done
  die "all $slots subnets of 198.18.0.0/15 are taken by other clusters"
}

# shape NS NODE_SUBNET: the two tiers on the rank's egress (eth0). Unshaped tiers go straight
# out (flowid 1:0 is HTB's direct queue); with sch_netem, a tier with latency gets a class
# (rate 100gbit when it has no bandwidth) with a netem child.
shape() {
  local ns=$1 node_net=$2 tier class bits delay qdisc=0
  local -A flows
  for tier in intra inter; do
    bits=${tier}_bits delay=${tier}_ns
    bits=${!bits} delay=${!delay}
    [[ $tier == intra ]] && class=10 || class=20
    flows[$tier]=1:0
    if ((bits > 0)) || { [[ $delay_by == netem ]] && ((delay > 0)); }; then
      ((qdisc)) || tc -n "$ns" qdisc add dev eth0 root handle 1: htb default 0
      qdisc=1
      ((bits > 0)) || bits=100000000000
      tc -n "$ns" class add dev eth0 parent 1: classid "1:$class" htb rate "${bits}bit" \
        ceil "${bits}bit" quantum 60000
      if [[ $delay_by == netem ]] && ((delay > 0)); then
        tc -n "$ns" qdisc add dev eth0 parent "1:$class" handle "$class:" netem \
          delay "$(((delay + 500) / 1000))us" limit 100000
      fi
      flows[$tier]=1:$class
    fi
  done
  ((qdisc)) || return 0
  tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$node_net" \
    flowid "${flows[intra]}"
  tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 2 u32 match ip dst 0.0.0.0/0 \
    flowid "${flows[inter]}"
}

# Starts the delay switch in the switch namespace and waits for its "ready" line.
start_delayswitch() {
  local ports=() k j i
  command -v cc >/dev/null || die "latency needs sch_netem or cc (to build the delay switch)"
  cc -O2 -o "$state/delayswitch" "$here/delayswitch.c" || die "could not build the delay switch"
  for ((k = 0; k < nodes; k++)); do
    for ((j = 0; j < ranks_per_node; j++)); do ports+=("n${k}r$j:$k"); done
  done
  ip netns exec "$prefix-sw" setsid "$state/delayswitch" "$intra_ns" "$inter_ns" "${ports[@]}" \
    >"$state/delayswitch.log" 2>&1 </dev/null {lock}<&- &
  for ((i = 0; i < 500; i++)); do
    grep -q 'ready$' "$state/delayswitch.log" 2>/dev/null && return 0
    kill -0 $! 2>/dev/null || break
    sleep 0.01
  done
  die "the delay switch did not start: $(cat "$state/delayswitch.log")"
}

write_agent() {
  cat >"$state/agent" <<EOF
#!/usr/bin/env bash
# The launch agent of cluster $prefix (tools/cluster/cluster.sh, state $state).
# Open MPI's rsh launcher calls it as it would call ssh: agent [SSH OPTIONS] [USER@]HOST
# COMMAND...; it runs COMMAND (its words joined by spaces, as ssh does) with bash inside the
# network namespace that owns HOST (an address of the hostfile or a namespace name), in a UTS
# namespace whose host name is the namespace's name. Exit status 255 when HOST is unknown.
set -euo pipefail
hosts=$(printf '%q' "$state/hosts")
EOF
  cat >>"$state/agent" <<'EOF'
stdin_null=0
while (($#)); do
  case $1 in
    --) shift; break ;;
    -[BbcDEeFIiJLlmOoPpQRSWw]) shift 2 || shift ;;  # ssh's options with a value
    -*) [[ $1 =~ ^-[a-zA-Z0-9]*n ]] && stdin_null=1; shift ;;
    *) break ;;
  esac
done
(($#)) || { echo "agent: no host" >&2; exit 255; }
host=${1##*@}
shift
ns=$(awk -v h="$host" '$1 == h || $2 == h { print $2; exit }' "$hosts")
[[ -n $ns ]] || { echo "agent: $host is not a host of this cluster" >&2; exit 255; }
((stdin_null)) && exec </dev/null
(($#)) || set -- exec bash -l
exec ip netns exec "$ns" unshare --uts bash -c 'hostname "$0" && exec bash -c "$1"' "$ns" "$*"
EOF
  chmod +x "$state/agent"
}

write_env() {
  local threads=$(($(nproc) / (nodes * ranks_per_node)))
  ((threads >= 1)) || threads=1
  cat >"$state/env.sh" <<EOF
# Open MPI's settings for cluster $prefix (tools/cluster/cluster.sh); run and exec source it.
# mpirun started inside rank 0's namespace with these reaches every rank's host over TCP.
export BOTTLE_CLUSTER_STATE=$(printf '%q' "$state")
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# Launch through the agent, every daemon straight from mpirun; the hostfile lists the hosts.
export OMPI_MCA_plm=rsh
export OMPI_MCA_plm_rsh_agent=$(printf '%q' "$state/agent")
export OMPI_MCA_plm_rsh_no_tree_spawn=1
export OMPI_MCA_orte_default_hostfile=$(printf '%q' "$state/hostfile")
export OMPI_MCA_rmaps_base_mapping_policy=slot
# Every emulated host is the same machine: binding would put every rank on core 0, and
# ranks waiting in MPI calls yield the cores they share.
export OMPI_MCA_hwloc_base_binding_policy=none OMPI_MCA_mpi_yield_when_idle=1
# The emulated hosts share this machine's cores: each rank's OpenMP gets its share unless the
# caller chose (every host would otherwise start a thread per core, and OpenMP threads that
# spin for a core they share slow a step tenfold).
export OMP_NUM_THREADS=\${OMP_NUM_THREADS:-$threads} OMP_WAIT_POLICY=\${OMP_WAIT_POLICY:-passive}
# TCP only, on the run's subnet: no shared memory (vader, UCX), whatever the namespaces share.
export OMPI_MCA_pml=ob1 OMPI_MCA_btl=tcp,self OMPI_MCA_osc=^ucx
export OMPI_MCA_btl_tcp_if_include=$subnet OMPI_MCA_oob_tcp_if_include=$subnet
# mpirun notices a host it lost (a cut link, a dead machine) by TCP keepalives on its
# connections to the hosts' daemons, and ends the job naming the host: after 5 s without
# traffic, a probe every 2 s, 3 missed (Open MPI's default waits 5 minutes, then 3). Set
# them below parallel.comm_timeout: once a rank aborts, mpirun's kill message to the lost
# host sits unacknowledged, which stops keepalives, and it then waits for TCP to give up on
# it (about 15 minutes).
export OMPI_MCA_oob_tcp_keepalive_time=\${OMPI_MCA_oob_tcp_keepalive_time:-5}
export OMPI_MCA_oob_tcp_keepalive_intvl=\${OMPI_MCA_oob_tcp_keepalive_intvl:-2}
export OMPI_MCA_oob_tcp_keepalive_probes=\${OMPI_MCA_oob_tcp_keepalive_probes:-3}
# Session directories in the state directory, so that down takes them away.
export OMPI_MCA_orte_tmpdir_base=$(printf '%q' "$state/tmp")
EOF
}

write_config() {
  {
    printf '# cluster %s, written by tools/cluster/cluster.sh up\n' "$prefix"
    local name
    for name in prefix nodes ranks_per_node slot subnet switch delay_by intra inter \
      intra_bits intra_ns inter_bits inter_ns state; do
      printf '%s=%q\n' "$name" "${!name}"
    done
  } >"$state/config"
}

# remove_state_files STATE: up's files, which it made (it refused a state directory that held
# any of their names) and marked; nothing else of the directory.
remove_state_files() {
  local name
  for name in "${state_files[@]}"; do rm -rf "${1:?}/$name"; done
  rm -f "$1/$cluster_marker"
}

# up_failed PREFIX STATE: what an up that did not finish leaves is removed.
up_failed() {
  local status=$?
  teardown "$1" >/dev/null 2>&1 || true
  remove_state_files "$2"
  printf 'cluster.sh: up %s failed (status %d); removed what it had made\n' "$1" "$status" >&2
}

cmd_up() {
  local nodes=1 ranks_per_node=1 intra=none inter=none prefix='' state='' delay_by=auto mtu=1500
  while (($#)); do
    case $1 in
      --mtu | --nodes | --ranks-per-node | --intra | --inter | --prefix | --state | --delay-by)
        need_value "$@" ;;
      *) die "up: unknown option '$1'" ;;
    esac
    case $1 in
      --mtu) mtu=$2 ;;
      --nodes) nodes=$2 ;;
      --ranks-per-node) ranks_per_node=$2 ;;
      --intra) intra=$2 ;;
      --inter) inter=$2 ;;
      --prefix) prefix=$2 ;;
      --state) state=$2 ;;
      --delay-by) delay_by=$2 ;;
    esac
    shift 2
  done
  [[ -n $state ]] || die "up: --state DIR is required"
  whole nodes --nodes 1 "$max_nodes"
  whole ranks_per_node --ranks-per-node 1 "$max_ranks"
  [[ -n $prefix ]] || prefix=$(new_prefix)
  valid_prefix "$prefix"
  # shellcheck disable=SC2034 # set by parse_link, read by shape and write_config
  local intra_bits intra_ns inter_bits inter_ns
  parse_link intra "$intra" --intra
  parse_link inter "$inter" --inter
  one_of --delay-by "$delay_by" auto netem switch
  whole mtu --mtu 1280 65535
  # The state directory may hold other files (emulate.sh keeps its output there), but none of
  # the names up writes: up would replace a user's hosts or agent, and down remove them.
  [[ ! -e $state || -d $state ]] || die "up: --state $state: not a directory"
  [[ ! -e $state/$cluster_marker ]] || die "up: $state already holds a cluster; run down first"
  local name
  for name in "${state_files[@]}"; do
    [[ ! -e $state/$name && ! -L $state/$name ]] ||
      die "up: $state/$name exists and is not cluster.sh's: give a state directory without ${state_files[*]}"
  done
  mkdir -p "$state"
  state=$(cd "$state" && pwd -P)

  # One cluster at a time chooses its subnet and creates its namespaces (not a lock on
  # /run/netns: ip netns add takes that one).
  local lock lockfile=/run/lock/bottle-cluster.lock
  [[ -d /run/lock ]] || lockfile=/tmp/bottle-cluster.lock
  exec {lock}>>"$lockfile"
  flock "$lock"
  [[ -z $(namespaces_of "$prefix") ]] || die "up: namespaces of prefix $prefix exist already"
  # From here on, a failure or a signal removes whatever was made (the values are written
  # into the trap: an error exit has left the function's locals when the trap runs).
  # shellcheck disable=SC2064
  trap "up_failed $(printf '%q' "$prefix") $(printf '%q' "$state")" EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
  # The marker first: whatever up makes from here on is its own, and down removes it.
  printf '# cluster.sh up made %s here; down removes them and this file\nprefix=%s\n' \
    "${state_files[*]}" "$prefix" >"$state/$cluster_marker"
  local slot base second third subnet switch=bridge
  slot=$(free_slot "$prefix")
  second=$((18 + slot / 16)) third=$((slot % 16 * 16))
  base=198.$second
  subnet=$base.$third.0/20
  local sw=$prefix-sw
  ip netns add "$sw"
  ip -n "$sw" link set lo up
  if ((intra_ns > 0 || inter_ns > 0)); then
    if [[ $delay_by == auto ]]; then
      delay_by=switch
      ip -n "$sw" link add probe0 type veth peer name probe1
      tc -n "$sw" qdisc add dev probe0 root netem delay 1ms 2>/dev/null && delay_by=netem
      ip -n "$sw" link del probe0
    fi
  else
    delay_by=none
  fi
  [[ $delay_by == switch ]] && switch=delayswitch
  if [[ $switch == bridge ]]; then
    ip -n "$sw" link add br0 type bridge
    ip -n "$sw" link set br0 addrgenmode none
    ip -n "$sw" link set br0 up
  fi
  : >"$state/hosts"
  : >"$state/hostfile"
  local k j ns port address
  for ((k = 0; k < nodes; k++)); do
    for ((j = 0; j < ranks_per_node; j++)); do
      ns=$prefix-n${k}r$j port=n${k}r$j address=$base.$((third + k)).$((j + 1))
      ip netns add "$ns"
      ip -n "$ns" link set lo up
      ip link add eth0 netns "$ns" mtu "$mtu" type veth peer name "$port" netns "$sw" mtu "$mtu"
      ip -n "$ns" link set eth0 addrgenmode none
      ip -n "$sw" link set "$port" addrgenmode none
      [[ $switch == bridge ]] && ip -n "$sw" link set "$port" master br0
      ip -n "$sw" link set "$port" up
      ip -n "$ns" addr add "$address/20" dev eth0
      ip -n "$ns" link set eth0 up
      shape "$ns" "$base.$((third + k)).0/24"
      printf '%s %s %d %d\n' "$address" "$ns" "$k" "$j" >>"$state/hosts"
      printf '%s slots=1\n' "$address" >>"$state/hostfile"
    done
  done
  [[ $switch == delayswitch ]] && start_delayswitch
  mkdir -p "$state/tmp"
  write_agent
  write_env
  write_config
  trap - EXIT INT TERM HUP
  flock -u "$lock"
  printf 'cluster.sh: %s up: %d nodes x %d ranks, subnet %s, intra %s, inter %s, latency by %s\n' \
    "$prefix" "$nodes" "$ranks_per_node" "$subnet" "$intra" "$inter" "$delay_by" >&2
}

# ---------------------------------------------------------------------------------------
# down

# Kills every process inside the namespaces named on stdin (TERM, then KILL after 2 s).
kill_inside() {
  local names=() pids round
  mapfile -t names
  for ((round = 0; round < 40; round++)); do
    pids=()
    local ns
    for ns in "${names[@]}"; do
      mapfile -t -O "${#pids[@]}" pids < <(ip netns pids "$ns" 2>/dev/null)
    done
    ((${#pids[@]})) || return 0
    if ((round == 0)); then
      # A stopped process (cluster.sh stop) acts on its TERM once continued.
      kill -TERM "${pids[@]}" 2>/dev/null || true
      kill -CONT "${pids[@]}" 2>/dev/null || true
    elif ((round >= 20)); then
      kill -KILL "${pids[@]}" 2>/dev/null || true
    fi
    sleep 0.1
  done
  echo "cluster.sh: processes left in the namespaces: ${pids[*]}" >&2
  return 1
}

# Removes the namespaces of a prefix (and with them their veth pairs and the bridge).
teardown() {
  local prefix=$1 names=() ns status=0
  mapfile -t names < <(namespaces_of "$prefix")
  ((${#names[@]})) || return 0
  printf '%s\n' "${names[@]}" | kill_inside || status=1
  for ns in "${names[@]}"; do
    ip netns del "$ns" 2>/dev/null || { echo "cluster.sh: could not delete $ns" >&2; status=1; }
  done
  return $status
}

cmd_down() {
  local state='' prefix=''
  while (($#)); do
    case $1 in
      --state) need_value "$@"; state=$2 ;;
      --prefix) need_value "$@"; prefix=$2 ;;
      *) die "down: unknown option '$1'" ;;
    esac
    shift 2
  done
  if [[ -n $prefix ]]; then
    valid_prefix "$prefix"
    teardown "$prefix"
    return
  fi
  state=${state:-${BOTTLE_CLUSTER_STATE:-}}
  [[ -n $state ]] || die "down: give --state DIR or --prefix P"
  # Only what up made goes, and only where up left its marker: a config, hosts or tmp of
  # someone else's is no cluster's.
  if [[ ! -f $state/$cluster_marker ]]; then
    [[ ! -e $state/config ]] ||
      die "down: $state/config was not written by cluster.sh up (no $cluster_marker): nothing removed (down --prefix P removes a cluster by its prefix)"
    return 0 # down already, or never up
  fi
  prefix=$(sed -n 's/^prefix=//p' "$state/$cluster_marker")
  valid_prefix "$prefix"
  teardown "$prefix"
  remove_state_files "$state"
}

# ---------------------------------------------------------------------------------------
# run, exec, with

# in_rank STATE RANK COMMAND...: COMMAND in the rank's namespace, host name and settings.
in_rank() {
  local state=$1 rank=$2 ns
  shift 2
  ns=$(awk -v r="$rank" 'NR == r + 1 { print $2 }' "$state/hosts")
  [[ -n $ns ]] || die "no rank $rank in this cluster"
  # shellcheck disable=SC2016 # expanded by the inner bash
  exec ip netns exec "$ns" unshare --uts bash -c \
    'hostname "$0" && . "$1" && shift && exec "$@"' "$ns" "$state/env.sh" "$@"
}

cmd_run() {
  local state=
  while (($#)); do
    case $1 in
      --state) need_value "$@"; state=$2; shift 2 ;;
      --) shift; break ;;
      *) die "run: unknown option '$1' (mpirun's arguments go after --)" ;;
    esac
  done
  load_state "$state"
  in_rank "$state" 0 mpirun "$@"
}

cmd_exec() {
  local state='' rank=0
  while (($#)); do
    case $1 in
      --state) need_value "$@"; state=$2; shift 2 ;;
      --rank) need_value "$@"; rank=$2; shift 2 ;;
      --) shift; break ;;
      *) die "exec: unknown option '$1' (the command goes after --)" ;;
    esac
  done
  (($#)) || die "exec: no command after --"
  whole rank --rank 0
  load_state "$state"
  in_rank "$state" "$rank" "$@"
}

cmd_with() {
  local up_args=() arg
  while (($#)) && [[ $1 != -- ]]; do up_args+=("$1"); shift; done
  (($#)) && shift
  (($#)) || die "with: no command after --"
  for arg in "${up_args[@]}"; do
    [[ $arg != --state ]] || die "with: the state directory is its own (no --state)"
  done
  local state child='' status=0
  state=$(mktemp -d "${TMPDIR:-/tmp}/bcl.XXXXXX")
  # Whatever ends this process (the command's end, an error, INT, TERM, HUP) ends the
  # command's process group and removes the cluster and its state directory.
  finish() {
    trap - EXIT INT TERM HUP
    if [[ -n $child ]]; then
      kill -TERM -- "-$child" 2>/dev/null || true
      local i
      for ((i = 0; i < 30; i++)); do kill -0 -- "-$child" 2>/dev/null || break; sleep 0.1; done
      kill -KILL -- "-$child" 2>/dev/null || true
      wait "$child" 2>/dev/null || true
    fi
    "$self" down --state "$state" || status=1
    rm -rf "$state"
    exit "$status"
  }
  trap finish EXIT
  trap 'status=130; finish' INT
  trap 'status=143; finish' TERM
  trap 'status=129; finish' HUP
  "$self" up --state "$state" "${up_args[@]}" || { status=$?; finish; }
  export BOTTLE_CLUSTER_STATE=$state
  set -m # the command in a process group of its own, so that all of it can be ended
  "$@" &
  child=$!
  set +m
  wait "$child" || status=$?
  child=
  report_stopped "$state" "the command ended (status $status)"
  finish
}

# ---------------------------------------------------------------------------------------
# faults and inspection

# The namespaces (column 2 of hosts) of node K, or of every node when K is empty.
node_namespaces() {
  awk -v k="$2" 'k == "" || $3 == k { print $2 }' "$1/hosts"
}

node_option() {
  if ! [[ $1 =~ ^[0-9]+$ ]] || ((10#$1 >= nodes)); then
    die "--node $1: the cluster has nodes 0 to $((nodes - 1))"
  fi
}

# set_links STATE NODE up|down: the switch-side ends of the node's veth pairs.
set_links() {
  local ns
  for ns in $(node_namespaces "$1" "$2"); do
    ip -n "$prefix-sw" link set "${ns#"$prefix"-}" "$3"
  done
}

cmd_fault() {
  local what=$1 state='' node=''
  shift
  while (($#)); do
    case $1 in
      --state) need_value "$@"; state=$2 ;;
      --node) need_value "$@"; node=$2 ;;
      *) die "$what: unknown option '$1'" ;;
    esac
    shift 2
  done
  load_state "$state"
  [[ -z $node ]] || node_option "$node"
  case $what in
    cut)
      [[ -n $node ]] || die "cut: --node K is required"
      set_links "$state" "$node" down
      ;;
    heal) set_links "$state" "$node" up ;;
    stop)
      [[ -n $node ]] || die "stop: --node K is required"
      signal_node "$state" "$node" STOP
      # When it was stopped, for report_stopped (one line a node: K SECONDS-SINCE-EPOCH).
      { grep -v "^$node " "$state/stopped" 2>/dev/null || true; echo "$node $(date +%s.%N)"; } \
        >"$state/stopped.new"
      mv "$state/stopped.new" "$state/stopped"
      ;;
    cont)
      signal_node "$state" "$node" CONT
      if [[ -z $node ]]; then
        rm -f "$state/stopped"
      elif [[ -f $state/stopped ]]; then
        { grep -v "^$node " "$state/stopped" || true; } >"$state/stopped.new"
        mv "$state/stopped.new" "$state/stopped"
      fi
      ;;
    pids)
      local ns
      for ns in $(node_namespaces "$state" "$node"); do ip netns pids "$ns"; done | sort -n
      ;;
  esac
}

# signal_node STATE NODE SIGNAL: SIGNAL to every process in the node's namespaces (every
# node's when NODE is empty), read again until no new one appears: a process that forks while
# the others are being stopped is stopped too.
signal_node() {
  local ns pid round seen=' ' new
  for ((round = 0; round < 10; round++)); do
    new=0
    for ns in $(node_namespaces "$1" "$2"); do
      for pid in $(ip netns pids "$ns" 2>/dev/null); do
        [[ $seen == *" $pid "* ]] && continue
        seen+="$pid "
        new=1
        kill -"$3" "$pid" 2>/dev/null || true
      done
    done
    ((new)) || return 0
  done
}

# report_stopped STATE WHAT: when nodes are stopped (cluster.sh stop), one line on stderr
# saying WHAT happened how long after each was stopped: a job that ends while a host is
# stopped is what a hung machine on a real cluster must not prevent (docs/design.md §23).
report_stopped() {
  [[ -s $1/stopped ]] || return 0
  local node at
  while read -r node at; do
    printf 'cluster.sh: %s %s s after node %s was stopped (cluster.sh stop); it is still stopped\n' \
      "$2" "$(awk -v a="$at" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')" "$node" >&2
  done <"$1/stopped"
}

cmd_list() {
  ip netns list 2>/dev/null | awk '{ print $1 }' | sed -n 's/^\([a-z][a-z0-9]*\)-n0r0$/\1/p' | sort
}

main() {
  (($#)) || { usage >&2; exit 2; }
  local command=$1
  shift
  case $command in
    check) cmd_check "$@" ;;
    up) cmd_up "$@" ;;
    down) cmd_down "$@" ;;
    run) cmd_run "$@" ;;
    exec) cmd_exec "$@" ;;
    with) cmd_with "$@" ;;
    cut | heal | pids | stop | cont) cmd_fault "$command" "$@" ;;
    list) cmd_list ;;
    help | -h | --help) usage ;;
    *) usage >&2; exit 2 ;;
  esac
}

main "$@"
