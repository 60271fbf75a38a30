# shellcheck shell=bash
# tests/cluster/lib.sh: what the cluster harness's tests share (sourced, not run).
# Sourcing it skips the test (exit 77) when `cluster.sh check` says no cluster can be made
# here, makes a work directory, and installs a trap that, however the test ends, takes down
# every cluster whose prefix the test registered with `own PREFIX` and removes the work
# directory. Prefixes are "bt" + 4 hex digits of the test's pid + a letter, so two tests
# running at once, or a test and a cluster of someone else, never share one.
set -euo pipefail
export LC_ALL=C

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
cluster=$root/tools/cluster/cluster.sh
test_name=$(basename "$0" .sh)

fail() {
  printf '%s: FAIL: %s\n' "$test_name" "$*" >&2
  exit 1
}
note() {
  printf '%s: %s\n' "$test_name" "$*"
}

check_status=0
"$cluster" check || check_status=$?
((check_status != 77)) || exit 77
((check_status == 0)) || fail "cluster.sh check failed ($check_status)"

# shellcheck disable=SC2034 # used by the tests that source this
tag=$(printf 'bt%04x' $((($$ ^ (RANDOM << 1)) & 0xffff)))
owned=()
own() { owned+=("$1"); }
work=$(mktemp -d "${TMPDIR:-/tmp}/$test_name.XXXXXX")
cleanup() {
  local status=$? prefix
  trap - EXIT INT TERM HUP
  for prefix in "${owned[@]}"; do "$cluster" down --prefix "$prefix" || status=1; done
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# The names of the root namespace's links, one a line.
root_links() {
  ip -o link show | awk -F': ' '{ sub(/@.*/, "", $2); print $2 }' | sort
}
links_before=$(root_links)

# Fails unless nothing of PREFIX is left: no namespace, no link of the root namespace that
# was not there when the test began or that names the prefix, no process in a namespace.
assert_clean() {
  local prefix=$1 left new
  left=$(ip netns list | awk '{ print $1 }' | grep -E "^$prefix-" || true)
  [[ -z $left ]] || fail "namespaces of $prefix left: $(xargs <<<"$left")"
  new=$(comm -13 <(echo "$links_before") <(root_links))
  [[ -z $new ]] || fail "links added to the root namespace: $(xargs <<<"$new")"
  ! ip -o link show | grep -q -- "$prefix" || fail "a root link names $prefix"
}

# Builds tools/cluster/pingpong.c into the work directory (MPI is required, not skipped).
build_pingpong() {
  command -v mpicc >/dev/null || fail "no mpicc (Debian package libopenmpi-dev)"
  command -v mpirun >/dev/null || fail "no mpirun (Debian package openmpi-bin)"
  mpicc -O2 -o "$work/pingpong" "$root/tools/cluster/pingpong.c" || fail "mpicc pingpong.c"
}

# value NAME FILE: the number after NAME in pingpong's output.
value() {
  awk -v k="$1" '$1 == k { print $2 }' "$2"
}

# Seconds since the test began, to one decimal.
started=$(date +%s.%N)
elapsed() {
  awk -v s="$started" -v n="$(date +%s.%N)" 'BEGIN { printf "%.1f s", n - s }'
}

# The tests that train (faults.sh, layouts.sh): `bottle` from their first argument, checked;
# a byte-level corpus of LINES distinct lines made without Python and prepared into
# $work/data; and $work/tiny.toml begun with the tiny 4-block CoLA model they train, to which
# each appends its own [training] and what follows.
bottle_and_tiny_model() {
  bottle=${1:?usage: $test_name.sh BOTTLE}
  [[ -x $bottle ]] || fail "no bottle binary at $bottle"
  command -v mpirun >/dev/null || fail "no mpirun (Debian package openmpi-bin)"
  awk -v n="$2" 'BEGIN { for (i = 1; i <= n; i++) printf "line %d: %d apples and %d pears\n", i, i * 7919 % 1000, i * 104729 % 977 }' \
    >"$work/corpus.txt"
  "$bottle" prepare --input "$work/corpus.txt" --output "$work/data" >/dev/null ||
    fail "bottle prepare"
  cat >"$work/tiny.toml" <<'EOF'
[model]
vocab_size = 256
hidden_size = 32
intermediate_size = 48
num_layers = 4
num_heads = 4
bottleneck = "cola"
rank = 8
max_seq_len = 64

EOF
}
