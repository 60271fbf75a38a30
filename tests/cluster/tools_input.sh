#!/usr/bin/env bash
# tests/cluster/tools_input.sh: the cluster tools (tools/cluster/cluster.sh, emulate.sh,
# bench_emulated.sh, bench_overlap.sh) refuse what they cannot run with, with one line on
# stderr naming the option and what it takes, before they make anything, and never replace or
# remove a file they did not make (issue 57, items 3, 6 and 7):
#   1. every option that takes a value, given none, says so (not "$2: unbound variable");
#   2. values they cannot use: --nodes abc, one rank to calibrate, a --preset that is no
#      cluster file, --layouts ax2, --trains 1x1x0, --repeats 0, --steps 0, --layouts '' with
#      nothing else to measure (each printed "every prediction within its target" or a table of
#      0.0 and -nan %, or failed after minutes of work);
#   3. output directories: `cluster.sh up --state DIR` refuses a DIR that holds any name it
#      writes (hosts, agent, env.sh, config, tmp, ...), `down` and `run` leave a DIR alone
#      whose config up did not write (nor run it), and bench_overlap.sh, bench_emulated.sh and
#      emulate.sh refuse an --out with files of someone else's (data/, corpus.txt, table.txt).
# Every case ends at a refusal, so the test needs no namespaces and no build and takes a few
# seconds. Given bottle's path (ctest passes it), it also checks --paper's models. Where
# `cluster.sh check` says clusters can be made, a 1 x 1 cluster goes up and down in a
# directory with a file of the user's, which stays.
set -euo pipefail
export LC_ALL=C

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd -P)
tools=$root/tools/cluster
bottle=${1:-}
test_name=tools_input
work=$(mktemp -d "${TMPDIR:-/tmp}/$test_name.XXXXXX")
prefix=$(printf 'bt%04xq' $((($$ ^ (RANDOM << 1)) & 0xffff)))

fail() {
  printf '%s: FAIL: %s\n' "$test_name" "$*" >&2
  exit 1
}
# However the test ends, a cluster that a tool brought up before refusing (as they did before
# issue 57's fixes: the test must fail, not leave namespaces behind) is taken down by its
# prefix, and the work directory removed.
cleanup() {
  local status=$? p
  trap - EXIT INT TERM HUP
  for p in "$prefix" $(cat "$work"/*/config "$work"/*/.made-by-cluster 2>/dev/null |
    sed -n 's/^prefix=//p' | sort -u); do
    "$tools/cluster.sh" down --prefix "$p" >/dev/null 2>&1 || true
  done
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
trap 'exit 129' HUP

# No tool may start bottle or a cluster's job here: a missing bottle, or one that fails.
export BOTTLE=$work/no-bottle TMPDIR=$work
printf '#!/bin/sh\nexit 1\n' >"$work/fake-bottle"
chmod +x "$work/fake-bottle"
fresh=$work/fresh # given as --out or --state: must not exist after a refusal
cases=0

# refused EXPECT COMMAND...: COMMAND exits non-zero within 30 s, prints nothing on stdout and
# one line on stderr that contains EXPECT, and has made nothing at $fresh.
refused() {
  local expect=$1 status=0
  shift
  timeout 30 "$@" >"$work/stdout" 2>"$work/stderr" </dev/null || status=$?
  ((status != 0)) || fail "$(printf '%q ' "$@")exited 0: $(head -c 300 "$work/stdout")"
  ((status != 124)) || fail "$(printf '%q ' "$@")was still running after 30 s"
  grep -qF -- "$expect" "$work/stderr" ||
    fail "$(printf '%q ' "$@")said '$(head -c 400 "$work/stderr")', not '$expect'"
  (($(wc -l <"$work/stderr") == 1)) ||
    fail "$(printf '%q ' "$@")said more than one line: $(head -c 400 "$work/stderr")"
  [[ ! -s $work/stdout ]] || fail "$(printf '%q ' "$@")printed $(head -c 300 "$work/stdout")"
  [[ ! -e $fresh ]] || fail "$(printf '%q ' "$@")made $fresh before refusing"
  cases=$((cases + 1))
}

# A directory of the user's files, and the fingerprint of all of it (names and contents).
user_dir() { # DIR NAME...
  local dir=$1 name
  shift
  mkdir -p "$dir"
  for name; do
    if [[ $name == */ ]]; then
      mkdir -p "$dir/$name" && echo "the user's" >"$dir/${name}keep"
    else
      echo "the user's $name" >"$dir/$name"
    fi
  done
}
fingerprint() {
  # shellcheck disable=SC2016 # the inner sh expands $1
  (cd "$1" && find . -print0 | LC_ALL=C sort -z | xargs -0 -I{} sh -c \
    'printf "%s " "$1"; if [ -f "$1" ]; then cksum <"$1"; else echo; fi' _ {})
}

# 1. An option that takes a value, given none (the last word), or given another option.
for option in --nodes --ranks-per-node --intra --inter --prefix --state --delay-by --mtu; do
  refused "$option needs a value" "$tools/cluster.sh" up "$option"
done
refused "--nodes needs a value (found --state)" \
  "$tools/cluster.sh" up --nodes --state "$fresh"
for option in --state --prefix; do refused "$option needs a value" "$tools/cluster.sh" down "$option"; done
refused "--state needs a value" "$tools/cluster.sh" run --state
refused "--state needs a value (found --)" "$tools/cluster.sh" run --state -- -np 1 true
for option in --state --rank; do refused "$option needs a value" "$tools/cluster.sh" exec "$option"; done
for command in cut heal pids; do
  for option in --state --node; do refused "$option needs a value" "$tools/cluster.sh" "$command" "$option"; done
done
for option in --preset --nodes --ranks-per-node --precision --out --state --max-mbit --gap-ms \
  --remeasure --bottle; do
  refused "$option needs a value" "$tools/emulate.sh" "$option"
done
for option in --preset --precision --config --set --layouts --trains --paper --paper-scale \
  --paper-layers --steps --warmup --repeats --out; do
  refused "$option needs a value" "$tools/bench_emulated.sh" --out "$fresh" "$option"
done
for option in --dp --zero-stages --config --inter --mtu --set --steps --warmup --repeats --out; do
  refused "$option needs a value" "$tools/bench_overlap.sh" --out "$fresh" "$option"
done
echo "$test_name: 1. $cases options given no value refused"

# 2. Values the tools cannot use.
before=$cases
printf '# a file of the user'"'"'s\n[gpu]\nfp32_tflops = 19.5\n' >"$work/not-a-cluster.toml"
up=("$tools/cluster.sh" up --state "$fresh" --prefix "$prefix")
refused "--nodes 'abc': give a whole number from 1 to 16" "${up[@]}" --nodes abc
refused "--nodes '0'" "${up[@]}" --nodes 0
refused "--ranks-per-node '65'" "${up[@]}" --ranks-per-node 65
refused "--mtu '100'" "${up[@]}" --mtu 100
refused "--delay-by 'tc': give auto, netem or switch" "${up[@]}" --delay-by tc
refused "--intra '3furlongs'" "${up[@]}" --intra 3furlongs
refused "--inter '1gbit,2'" "${up[@]}" --inter 1gbit,2
refused "--rank 'x'" "$tools/cluster.sh" exec --state "$fresh" --rank x -- true

emulate=("$tools/emulate.sh" --state "$fresh")
refused "--nodes 'abc': give a whole number" "${emulate[@]}" --preset a100-perlmutter --nodes abc \
  --ranks-per-node 2
refused "--nodes 1 --ranks-per-node 1: one rank; the calibration (bottle plan --calibrate) needs at least 2" \
  "${emulate[@]}" --preset a100-perlmutter --nodes 1 --ranks-per-node 1
refused "--preset '$work/not-a-cluster.toml': not a cluster file" "${emulate[@]}" \
  --preset "$work/not-a-cluster.toml" --nodes 1 --ranks-per-node 2
refused "--preset 'a100'" "${emulate[@]}" --preset a100 --nodes 1 --ranks-per-node 2
emulate+=(--preset a100-perlmutter --nodes 1 --ranks-per-node 2)
refused "--precision 'fp8'" "${emulate[@]}" --precision fp8
refused "--max-mbit '0'" "${emulate[@]}" --max-mbit 0
refused "--gap-ms 'x'" "${emulate[@]}" --gap-ms x
refused "--remeasure 'a/b'" "${emulate[@]}" --remeasure a/b
refused "--bottle $work/no-bottle" "${emulate[@]}"
refused "--remeasure: $fresh/emulate holds no output of an earlier emulate.sh" \
  "${emulate[@]}" --bottle "$work/fake-bottle" --remeasure after

bench=("$tools/bench_emulated.sh" --out "$fresh")
refused "nothing to measure: --layouts is empty" "${bench[@]}" --layouts ''
refused "--repeats '0': give a whole number, 1 or more" "${bench[@]}" --repeats 0
refused "--trains '1x1x0'" "${bench[@]}" --trains 1x1x0
refused "--trains '2x1x3'" "${bench[@]}" --trains 2x1x3
refused "--trains '1x1x1'" "${bench[@]}" --trains 1x1x1
refused "--layouts 'ax2'" "${bench[@]}" --layouts ax2
refused "--layouts '1x1'" "${bench[@]}" --layouts "1x2 1x1"
refused "--layouts '17x1'" "${bench[@]}" --layouts 17x1
refused "--steps '0'" "${bench[@]}" --steps 0
refused "--warmup 'x'" "${bench[@]}" --warmup x
refused "--paper-scale '0'" "${bench[@]}" --paper-scale 0
refused "--paper-layers '0'" "${bench[@]}" --paper-layers 0
refused "--set 'seq_len'" "${bench[@]}" --set seq_len
refused "--config '$work/none.toml'" "${bench[@]}" --config "$work/none.toml"
refused "--precision 'fp16'" "${bench[@]}" --precision fp16
refused "--preset '$work/not-a-cluster.toml'" "${bench[@]}" --preset "$work/not-a-cluster.toml"
# An empty --layouts with trains to run is no error: it goes on to look for bottle.
refused "no bottle binary at $work/no-bottle" "${bench[@]}" --layouts '' --trains 1x1x2

overlap=("$tools/bench_overlap.sh" --out "$fresh")
refused "--steps '0': give a whole number, 1 or more" "${overlap[@]}" --steps 0
refused "--repeats '0'" "${overlap[@]}" --repeats 0
refused "--warmup '-1'" "${overlap[@]}" --warmup -1
refused "--dp '1': give a whole number from 2 to 16" "${overlap[@]}" --dp 1
refused "--zero-stages '4': give 0, 1, 2 or 3" "${overlap[@]}" --zero-stages "1 4"
refused "--zero-stages '': give ZeRO stages" "${overlap[@]}" --zero-stages ''
refused "--mtu '9001x'" "${overlap[@]}" --mtu 9001x
refused "--inter '400mbps'" "${overlap[@]}" --inter 400mbps
refused "--set 'x'" "${overlap[@]}" --set x
refused "--config '$work/none.toml'" "${overlap[@]}" --config "$work/none.toml"
refused "no bottle binary at $work/no-bottle" "${overlap[@]}"

if [[ -n $bottle ]]; then
  [[ -x $bottle ]] || fail "no bottle binary at $bottle"
  paper=(env BOTTLE="$bottle" "$tools/bench_emulated.sh" --out "$fresh")
  refused "--paper '99B': no such model in bottle plan --paper" "${paper[@]}" --paper 99B
  refused "nothing to measure: --layouts is empty, no --trains, and --paper '1B'" \
    "${paper[@]}" --layouts '' --paper 1B
  refused "--paper-scale 100000" "${paper[@]}" --layouts '' --paper 3B --paper-scale 100000
  refused "--paper-layers 3 is not a multiple of 13B's PP 2" "${paper[@]}" --paper 13B --paper-layers 3
  # The paper's 3B alone is something to measure: refused only for the --out below.
  user_dir "$work/paper-out" table.txt
  refused "--out $work/paper-out: a directory with files not made by bench_emulated.sh" \
    env BOTTLE="$bottle" "$tools/bench_emulated.sh" --layouts '' --paper 3B --out "$work/paper-out"
else
  echo "$test_name: no bottle given: --paper's models not checked"
fi
echo "$test_name: 2. $((cases - before)) values refused"

# 3. Files that are not the tool's.
before=$cases
for name in config hosts hostfile agent env.sh tmp/ delayswitch delayswitch.log; do
  dir=$work/state-${name%/}
  user_dir "$dir" "$name" notes.txt
  print=$(fingerprint "$dir")
  refused "up: $dir/${name%/} exists and is not cluster.sh's" \
    "$tools/cluster.sh" up --state "$dir" --prefix "$prefix"
  [[ $(fingerprint "$dir") == "$print" ]] || fail "up changed $dir"
  ! ip netns list 2>/dev/null | grep -q "^$prefix-" || fail "up made namespaces of $prefix"
done
# A config of the user's, which would touch a file if run, is neither run nor removed.
dir=$work/state-user
user_dir "$dir" hosts agent env.sh tmp/
printf 'prefix=%s\ntouch %q\n' "$prefix" "$work/ran" >"$dir/config"
print=$(fingerprint "$dir")
refused "down: $dir/config was not written by cluster.sh up" "$tools/cluster.sh" down --state "$dir"
refused "$dir holds no cluster that is up" "$tools/cluster.sh" run --state "$dir" -- -np 1 true
refused "$dir holds no cluster that is up" "$tools/cluster.sh" exec --state "$dir" -- true
[[ $(fingerprint "$dir") == "$print" ]] || fail "down, run or exec changed $dir"
[[ ! -e $work/ran ]] || fail "down, run or exec ran the user's config"

dir=$work/overlap-out
user_dir "$dir" corpus.txt data/ table.txt serial_1/
print=$(fingerprint "$dir")
refused "--out $dir: a directory with files not made by bench_overlap.sh" \
  env BOTTLE="$work/fake-bottle" "$tools/bench_overlap.sh" --out "$dir"
[[ $(fingerprint "$dir") == "$print" ]] || fail "bench_overlap.sh changed $dir"
dir=$work/emulated-out
user_dir "$dir" table.txt data/ corpus.txt 1x2_1/
print=$(fingerprint "$dir")
refused "--out $dir: a directory with files not made by bench_emulated.sh" \
  env BOTTLE="$work/fake-bottle" "$tools/bench_emulated.sh" --layouts 1x2 --out "$dir"
[[ $(fingerprint "$dir") == "$print" ]] || fail "bench_emulated.sh changed $dir"
dir=$work/emulate-out
user_dir "$dir" raw.toml emulated.toml
print=$(fingerprint "$dir")
refused "--out $dir: a directory with files not made by emulate.sh" "$tools/emulate.sh" \
  --preset h100 --nodes 1 --ranks-per-node 2 --state "$fresh" --bottle "$work/fake-bottle" --out "$dir"
[[ $(fingerprint "$dir") == "$print" ]] || fail "emulate.sh changed $dir"
echo "$test_name: 3. $((cases - before)) directories of the user's refused, and left as they were"

# Up and down in a directory that holds a file of the user's (emulate.sh keeps its output in
# the state directory): the file stays, and nothing of the cluster's does.
check=0
"$tools/cluster.sh" check >/dev/null || check=$?
if ((check == 0)); then
  dir=$work/state-shared
  user_dir "$dir" notes.txt emulate/
  print=$(fingerprint "$dir")
  "$tools/cluster.sh" up --state "$dir" --prefix "$prefix" 2>/dev/null || fail "up in $dir"
  [[ -f $dir/.made-by-cluster && -f $dir/hosts ]] || fail "up wrote no marker or hosts"
  "$tools/cluster.sh" down --state "$dir" || fail "down in $dir"
  [[ $(fingerprint "$dir") == "$print" ]] || fail "up and down left $dir otherwise than they found it"
  echo "$test_name: up and down beside the user's files: they stay, nothing else does"
else
  echo "$test_name: no cluster can be made here: up and down beside the user's files not run"
fi
echo "$test_name: ok, $cases cases"
