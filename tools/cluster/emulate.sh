#!/usr/bin/env bash
# tools/cluster/emulate.sh: a GPU cluster preset, emulated on this machine's cluster harness
# (tools/cluster/cluster.sh) in dilated time, and the cluster file `bottle plan` predicts
# runs on that emulation with (issue 43; docs/design.md §24).
#
#   tools/cluster/emulate.sh --preset a100-perlmutter|h100|h200|FILE --nodes N
#       --ranks-per-node R [--precision fp32|bf16] [--out DIR] [--state DIR]
#       [--max-mbit M] [--gap-ms G] [--remeasure TAG] [--bottle PATH]
#
# 1. An unshaped N × R cluster (the one in --state / $BOTTLE_CLUSTER_STATE when it is up,
#    else one brought up there) runs `bottle plan --calibrate DIR/raw.toml` on all N·R ranks
#    at once, one thread each: the rank's rates with every rank busy.
# 2. k = (the preset GPU's peak in that precision × its gemm efficiency) / (the rank's GEMM
#    rate in that precision): one second of the GPU's work takes k seconds here.
# 3. The cluster is brought up again in the same state directory (same prefix) with each tier
#    shaped as the preset's link dilated by k: bandwidth / k, latency × k. A bandwidth above
#    --max-mbit (default 1500: what the delay switch carries per tier) is clamped to it and
#    said so. NCCL's base latency × k is no link property: it is reported, not emulated.
# 4. bottle's all-reduce is measured on the shaped links (tools/cluster/allreduce_probe.c,
#    built by mpicc, PROBE_ALGO=bottle: on a power-of-two group bottle's MPI communicator does
#    not call MPI_Allreduce but its own recursive doubling in chunks of 2^18 elements, up to
#    16 chunks' exchanges in flight, each a rendezvous above the eager limit): two ranks inside
#    node 0, two ranks on nodes 0 and 1, and all ranks; the sizes
#    bench tp's TP all-reduces have (0.5 to 8 MiB, above Open MPI's TCP eager limit) and 64 B,
#    each call after --gap-ms (default 20) of the ranks spinning on their cores, as a step's
#    collectives come between its kernels (back to back, or after a sleep that leaves the
#    cores to others, calls run otherwise than in a step on shared cores). From them:
#      β   (per tier) 1 / the slope of the least-squares line (in relative error: weights
#          1/t²) through the two-rank all-reduces' medians over the large sizes
#          (2(n−1)/n = 1);
#      a   the per-call base: a 64-byte two-rank all-reduce less the link's one-way latency
#          (what MPI's call costs beyond one trip);
#      α   (per tier) the per-step latency of a large message: half of (the two-rank line's
#          intercept − a). Above the eager limit every step is a rendezvous (request, clear
#          to send, data), about three one-way trips and more, not NCCL's one.
#      αs  (per tier, small_latency_us) half the one-way latency: a message of at most
#          Open MPI's TCP eager limit less 64 bytes of header (ompi_info's
#          btl_tcp_eager_limit; nccl.small_message_bytes) goes at once, and two ranks' small
#          all-reduce takes a and one trip, 2(n − 1) = 2 steps.
#      α', β' (inter-node, N ≥ 2) those that make the planner's ring formula fit the all-rank
#          probe (below: Open MPI's all-reduce over N·R ranks is not two two-rank exchanges).
#      s, c  overlap.compute_slowdown and .call_slowdown: `bottle plan --calibrate` run again
#          on the shaped links (DIR/shaped.toml, of which only they are kept): how much longer
#          GEMMs take beside started all-reduces, whose packet work here runs on the cores
#          that compute, and how much longer those all-reduces take than blocking ones.
#    and writes DIR/emulated.toml: raw.toml's "GPU" (this machine's rank), gpus_per_node = R,
#    the measured links (α, αs, β), nccl.base_latency_us = a, nccl.small_message_bytes, s
#    and c, a comment at the top with k, the preset and intended vs measured figures. DIR/emulate.env holds the same as shell variables.
#
# --out DIR (default: STATE/emulate) is a new or empty directory, or one of an earlier run
# (.made-by-emulate): one with other files is refused, as its names would be replaced. Every
# argument is checked before the cluster comes up: N·R of 2 ranks at least (the calibration
# all-reduces), a --preset that holds each figure dilated, a number each.
# --remeasure TAG (letters, digits, _): the shaped cluster of an earlier emulate.sh into the
# same --out and --state is still up; only step 4 runs again (links drift on a shared
# machine), writing DIR/emulated-TAG.toml, DIR/emulate-TAG.env and DIR/probe_*-TAG.txt.
# Leaves the shaped cluster up in the state directory (the caller takes it down: `cluster.sh
# down --state DIR`, or `cluster.sh with` does). Needs root (as cluster.sh), mpicc, awk.
# shellcheck disable=SC2154 # variables set by printf -v and by sourced files
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cluster=$here/cluster.sh

preset='' nodes='' rpn='' precision=fp32 out='' state=${BOTTLE_CLUSTER_STATE:-} max_mbit=1500 gap_ms=20 tag='' remeasure=0
bottle=${BOTTLE:-$root/build/bottle}
die() { echo "emulate.sh: $*" >&2; exit 2; }
# need_value, whole, number, one_of, preset, toml, check_out_dir, make_out_dir.
# shellcheck source-path=SCRIPTDIR source=args.sh
. "$here/args.sh"
while (($#)); do
  case $1 in
    -h | --help) sed -n '2,/^# shellcheck/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    --preset | --nodes | --ranks-per-node | --precision | --out | --state | --max-mbit | --gap-ms | \
      --remeasure | --bottle) need_value "$@" ;;
    *) die "unknown argument '$1' (--help)" ;;
  esac
  case $1 in
    --preset) preset=$2 ;;
    --nodes) nodes=$2 ;;
    --ranks-per-node) rpn=$2 ;;
    --precision) precision=$2 ;;
    --out) out=$2 ;;
    --state) state=$2 ;;
    --max-mbit) max_mbit=$2 ;;
    --gap-ms) gap_ms=$2 ;;
    --remeasure) tag=$2 remeasure=1 ;;
    --bottle) bottle=$2 ;;
  esac
  shift 2
done
# Every argument is checked before a cluster comes up or a file is written: a bad one would
# otherwise fail after the calibration, or as what it became (an unbound variable, awk's
# syntax error over a file that is no cluster file).
[[ -z $nodes ]] || whole nodes --nodes 1 "$max_nodes"
[[ -z $rpn ]] || whole rpn --ranks-per-node 1 "$max_ranks"
[[ -n $preset && -n $nodes && -n $rpn ]] || die "--preset, --nodes and --ranks-per-node are required"
np=$((nodes * rpn))
# bottle plan --calibrate measures the all-reduce between ranks: one rank cannot calibrate.
((np >= 2)) || die "--nodes $nodes --ranks-per-node $rpn: one rank; the calibration (bottle plan --calibrate) needs at least 2"
one_of --precision "$precision" fp32 bf16
preset preset --preset "$precision"
number --max-mbit "$max_mbit" positive
number --gap-ms "$gap_ms"
if ((remeasure)); then
  [[ $tag =~ ^[A-Za-z0-9_]+$ ]] || die "--remeasure '$tag': give a tag of letters, digits and _ (it names files)"
  tag=-$tag
fi
[[ -n $state ]] || die "no state directory: --state DIR or BOTTLE_CLUSTER_STATE"
[[ -f $bottle && -x $bottle ]] || die "--bottle $bottle: no bottle binary there (build it, or give --bottle PATH)"
out=${out:-$state/emulate}
check_out_dir --out "$out" emulate
if ((remeasure)) && ! [[ -f $out/.made-by-emulate && -f $out/raw.toml ]]; then
  die "--remeasure: $out holds no output of an earlier emulate.sh (its raw.toml)"
fi
command -v mpicc >/dev/null || die "no mpicc (it builds the all-reduce probe; Debian package libopenmpi-dev)"

calc() { awk "BEGIN { printf \"%.6g\", $* }"; }

# --- 1. the unshaped cluster, calibrated on all ranks --------------------------------------
if [[ -f $state/$cluster_marker && -f $state/config ]]; then
  # shellcheck disable=SC1091
  read -r prefix c_nodes c_rpn < <(. "$state/config" && echo "$prefix $nodes $ranks_per_node")
  [[ $c_nodes == "$nodes" && $c_rpn == "$rpn" ]] ||
    die "$state holds a $c_nodes x $c_rpn cluster, not $nodes x $rpn"
elif [[ -n $tag ]]; then
  die "--remeasure: $state holds no cluster"
else
  prefix=em$(printf '%05x' $((($$ * 7919 + RANDOM) % 1048576)))
  "$cluster" up --state "$state" --prefix "$prefix" --nodes "$nodes" --ranks-per-node "$rpn" >&2
fi
make_out_dir "$out" emulate
# Every rank one thread, as bench tp's ranks run here.
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
mpi_env=(-x OMP_NUM_THREADS -x OMP_WAIT_POLICY)
if [[ -z $tag ]]; then
  echo "emulate.sh: calibrating $np ranks (unshaped)" >&2
  "$cluster" run --state "$state" -- -np "$np" "${mpi_env[@]}" "$bottle" plan --calibrate \
    "$out/raw.toml" > "$out/calibrate.log" 2>&1 || { cat "$out/calibrate.log" >&2; die "calibrate failed"; }
fi

# --- 2. the dilation ------------------------------------------------------------------------
peak=$(toml "$preset" gpu "${precision}_tflops")
eta=$(toml "$preset" efficiency gemm)
rate=$(toml "$out/raw.toml" gpu "${precision}_tflops")
awk -v r="$rate" 'BEGIN { exit !(r + 0 > 0) }' ||
  die "$out/raw.toml has no [gpu] ${precision}_tflops above 0 (see $out/calibrate.log)"
k=$(calc "$peak * $eta / $rate")

# --- 3. the preset's links, dilated, shaped ------------------------------------------------
notes=()
dilate() { # TIER: sets <tier>_mbit, <tier>_lat_us (intended) and <tier>_req_mbit (requested)
  local bw lat mbit req
  bw=$(toml "$preset" "links.$1" bandwidth_gbs)
  lat=$(toml "$preset" "links.$1" latency_us)
  mbit=$(calc "$bw * 8000 / $k")
  req=$mbit
  if awk "BEGIN { exit !($mbit > $max_mbit) }"; then
    req=$max_mbit
    notes+=("$1: the dilated bandwidth $mbit Mbit/s is above what the delay switch carries; clamped to $max_mbit Mbit/s")
  fi
  printf -v "${1}_mbit" %s "$mbit"
  printf -v "${1}_req_mbit" %s "$(printf '%.0f' "$req")"
  printf -v "${1}_lat_us" %s "$(calc "$lat * $k")"
}
dilate intra_node
dilate inter_node
base_us=$(calc "$(toml "$preset" nccl base_latency_us) * $k")
notes+=("NCCL's base latency x k = $base_us us per call is not a link property and is not emulated")
intra_link="${intra_node_req_mbit}mbit,$(printf '%.0f' "$intra_node_lat_us")us"
inter_link="${inter_node_req_mbit}mbit,$(printf '%.0f' "$inter_node_lat_us")us"
for n in "${notes[@]}"; do echo "emulate.sh: $n" >&2; done
echo "emulate.sh: k = $k; shaping intra $intra_link, inter $inter_link" >&2
if [[ -z $tag ]]; then
  "$cluster" down --state "$state" >&2
  "$cluster" up --state "$state" --prefix "$prefix" --nodes "$nodes" --ranks-per-node "$rpn" \
    --intra "$intra_link" --inter "$inter_link" >&2
fi

# --- 4. the shaped links as MPI sees them ---------------------------------------------------
probe=$out/allreduce_probe
mpicc -O2 -o "$probe" "$here/allreduce_probe.c"
mapfile -t addr < <(awk '!/^#/ { print $1 }' "$state/hosts")
# The sizes bench tp's TP all-reduces have at its configurations here (0.5 to 11 MiB in fp32,
# half as many bytes in bf16), and a small one, in the precision's element size (bottle's
# chunks are 2^18 elements).
if [[ $precision == bf16 ]]; then
  element=2 sizes=(64 262144 524288 1048576 2097152 4194304)
else
  element=4 sizes=(64 524288 1048576 2097152 4194304 8388608)
fi
large=("${sizes[@]:1}")
measure() { # NAME HOSTS NP
  "$cluster" run --state "$state" -- -np "$3" --host "$2" -x PROBE_GAP_MS="$gap_ms" -x PROBE_SPIN=1 \
    -x PROBE_ALGO=bottle -x PROBE_ELEMENT_BYTES="$element" \
    "$probe" \
    "${sizes[@]}" 2>/dev/null |
    grep -E '^(allreduce|oneway)' > "$out/probe_$1$tag.txt"
}
field() { # NAME BYTES: median µs of that size; NAME oneway: the one-way latency
  if [[ $2 == oneway ]]; then awk '/^oneway/ { print $2 }' "$out/probe_$1$tag.txt"
  else awk -v b="$2" '/^allreduce/ && $5 == b { print $7 }' "$out/probe_$1$tag.txt"; fi
}
echo "emulate.sh: measuring the shaped links" >&2
((rpn >= 2)) && measure intra "${addr[0]},${addr[1]}" 2
((nodes >= 2)) && measure inter "${addr[0]},${addr[$rpn]}" 2
((np > 2)) && measure all "$(IFS=,; echo "${addr[*]}")" "$np"
# fit NAME: a two-rank probe's least-squares line over the large sizes, in relative error
# (weights 1/t², so that every size counts alike, as the planner's errors are judged; a plain
# fit would follow the largest size, and one chunk at a time bottle's all-reduce grew faster
# than linearly) (2(n−1)/n = 1: the slope is 1/β), its intercept, its small message and the one-way latency: sets fit_bw_gbs,
# fit_icept_us, fit_small_us, fit_oneway_us.
fit() {
  local line
  line=$(awk -v list="${large[*]}" 'BEGIN { n = split(list, l, " "); for (i = 1; i <= n; ++i) want[l[i]] = 1 }
    /^allreduce/ && ($5 in want) { x = $5; y = $7; w = 1 / (y * y)
      sw += w; sx += w * x; sy += w * y; sxx += w * x * x; sxy += w * x * y }
    END { b = (sw * sxy - sx * sy) / (sw * sxx - sx * sx); printf "%.6g %.6g", 1e-3 / b, (sy - b * sx) / sw }' \
    "$out/probe_$1$tag.txt")
  fit_bw_gbs=${line% *} fit_icept_us=${line#* }
  fit_small_us=$(field "$1" 64)
  fit_oneway_us=$(field "$1" oneway)
}
tier=intra
((rpn >= 2)) || tier=inter
fit "$tier"
a_us=$(calc "$fit_small_us - $fit_oneway_us")
awk "BEGIN { exit !($a_us < 0) }" && a_us=0
for t in intra inter; do
  if [[ -f $out/probe_$t$tag.txt ]]; then
    fit "$t"
    printf -v "m_${t}_gbs" %s "$fit_bw_gbs"
    alpha=$(calc "($fit_icept_us - $a_us) / 2")
    awk "BEGIN { exit !($alpha < 0) }" && alpha=0
    printf -v "m_${t}_alpha_us" %s "$alpha"
    printf -v "m_${t}_oneway_us" %s "$fit_oneway_us"
    # A message under Open MPI's eager limit goes at once, without a rendezvous: two ranks'
    # small all-reduce is the base and one trip, 2(n − 1) = 2 steps of half a trip each.
    printf -v "m_${t}_small_us" %s "$(calc "$fit_oneway_us / 2")"
  fi
done
# Open MPI's TCP eager limit (it counts its header: 64 bytes are left for it).
eager=$(ompi_info --param btl tcp --level 9 2>/dev/null |
  awk -F'"' '/"btl_tcp_eager_limit"/ { print $4; exit }')
[[ $eager =~ ^[0-9]+$ ]] || eager=65536
small_bytes=$((eager - 64))
# Across nodes, the group the runs use is all N·R ranks, whose all-reduce Open MPI does its
# own way (a ring where the two-rank probe is one exchange each way): the inter-node figures
# are those for which the planner's ring formula, a + (2(n−1) − 2(N−1))α + 2(N−1)α' +
# 2(n−1)/n·S/β', fits the all-rank probe's line: β' from its slope, α' from its intercept
# (with a and the intra-node α as measured). The two-rank inter-node probe is kept for the
# record (its one-way latency is the link's).
if [[ -f $out/probe_all$tag.txt && $nodes -ge 2 ]]; then
  fit all
  slope_us_per_byte=$(calc "1e-3 / $fit_bw_gbs")
  m_inter_gbs=$(calc "2 * ($np - 1) / $np / $slope_us_per_byte * 1e-3")
  alpha=$(calc "($fit_icept_us - $a_us - (2 * ($np - 1) - 2 * ($nodes - 1)) * ${m_intra_alpha_us:-0}) / (2 * ($nodes - 1))")
  awk "BEGIN { exit !($alpha < 0) }" && alpha=0
  m_inter_alpha_us=$alpha
fi
# A tier that has no two ranks here (one node; one rank per node) keeps the other's figures.
if [[ -z ${m_intra_gbs:-} ]]; then m_intra_gbs=$m_inter_gbs m_intra_alpha_us=$m_inter_alpha_us m_intra_oneway_us=$m_inter_oneway_us m_intra_small_us=$m_inter_small_us; intra_note="not measured (one rank per node): the inter-node figures"; fi
if [[ -z ${m_inter_gbs:-} ]]; then m_inter_gbs=$m_intra_gbs m_inter_alpha_us=$m_intra_alpha_us m_inter_oneway_us=$m_intra_oneway_us m_inter_small_us=$m_intra_small_us; inter_note="not measured (one node): the intra-node figures"; fi

# What overlap costs on these links: bottle plan --calibrate on the shaped cluster, of whose
# file only [overlap] is taken (GEMMs beside started all-reduces, whose packet work runs on the
# cores that compute, and those all-reduces, polled with pauses, against blocking ones).
echo "emulate.sh: measuring the kernels' slowdown beside transfers on the shaped links" >&2
"$cluster" run --state "$state" -- -np "$np" "${mpi_env[@]}" "$bottle" plan --calibrate \
  "$out/shaped$tag.toml" > "$out/calibrate-shaped$tag.log" 2>&1 ||
  { cat "$out/calibrate-shaped$tag.log" >&2; die "calibrate on the shaped links failed"; }
slowdown=$(toml "$out/shaped$tag.toml" overlap compute_slowdown)
call_slowdown=$(toml "$out/shaped$tag.toml" overlap call_slowdown)

# --- the emulated cluster file --------------------------------------------------------------
{
  echo "# Emulated: preset $(basename "$preset" .toml) in $precision, dilated by k = $k, on $nodes node(s) x $rpn rank(s)"
  echo "# of tools/cluster/cluster.sh (written by tools/cluster/emulate.sh on $(date -u +%FT%TZ))."
  echo "# k = $peak TFLOP/s x gemm efficiency $eta / this rank's measured $precision rate $rate TFLOP/s."
  echo "# The GPU is this machine's rank at its measured rates (raw.toml: bottle plan --calibrate on"
  echo "# all $np ranks at once, unshaped); the links are MPI's all-reduce measured on the shaped links."
  echo "# intra-node: intended $intra_node_mbit Mbit/s, $intra_node_lat_us us (preset / k, x k); shaped $intra_link;"
  echo "#   measured one-way $m_intra_oneway_us us, all-reduce bandwidth $(calc "$m_intra_gbs * 8000") Mbit/s,"
  echo "#   per-step latency of a large message $m_intra_alpha_us us, of one of at most $small_bytes bytes $m_intra_small_us us ${intra_note:-}"
  echo "# inter-node: intended $inter_node_mbit Mbit/s, $inter_node_lat_us us; shaped $inter_link;"
  echo "#   measured one-way $m_inter_oneway_us us, all-reduce bandwidth $(calc "$m_inter_gbs * 8000") Mbit/s,"
  echo "#   per-step latency of a large message $m_inter_alpha_us us, of one of at most $small_bytes bytes $m_inter_small_us us ${inter_note:-}"
  echo "# per call: intended NCCL base x k = $base_us us (not emulated); measured MPI base $a_us us."
  echo "# overlap: on the shaped links, GEMMs beside started all-reduces took $slowdown longer"
  echo "#   (compute_slowdown), and those all-reduces $call_slowdown longer than blocking (call_slowdown)."
  for n in "${notes[@]}"; do echo "# note: $n"; done
  if [[ -f $out/probe_all$tag.txt ]]; then
    echo "# all $np ranks, all-reduce measured vs this file's ring/tree (µs):"
    awk -v n="$np" -v N="$nodes" -v a="$a_us" -v al="$m_intra_alpha_us" -v an="$m_inter_alpha_us" \
        -v b="$m_inter_gbs" '/^allreduce/ { S = $5
      ring = a + (2 * (n - 1) - 2 * (N - 1)) * al + 2 * (N - 1) * an + 2 * (n - 1) / n * S / b / 1e3
      tree = a + 2 * ((n / N - 1) * al + int(log(N) / log(2) + 1e-9) * an) + 2 * S / b / 1e3
      printf "#   %9d bytes: %9.0f measured, %9.0f predicted\n", S, $7, ring < tree ? ring : tree }' \
      "$out/probe_all$tag.txt"
  fi
  awk -v R="$rpn" -v ib="$m_intra_gbs" -v il="$m_intra_alpha_us" -v eb="$m_inter_gbs" \
      -v el="$m_inter_alpha_us" -v base="$a_us" -v sd="$slowdown" -v cs="$call_slowdown" \
      -v is="$m_intra_small_us" -v es="$m_inter_small_us" -v sb="$small_bytes" \
      -v name="emulated-$(basename "$preset" .toml)" '
    /^#/ { next }
    /^\[/ { sec = $1 }
    sec == "[cluster]" && $1 == "name" { print "name = \"" name "\""; next }
    sec == "[node]" && $1 == "gpus" { print "gpus = " R; next }
    sec == "[links.intra_node]" && $1 == "bandwidth_gbs" { print "bandwidth_gbs = " ib; next }
    sec == "[links.intra_node]" && $1 == "latency_us" { print "latency_us = " il; next }
    sec == "[links.intra_node]" && $1 == "small_latency_us" { print "small_latency_us = " is; next }
    sec == "[links.inter_node]" && $1 == "bandwidth_gbs" { print "bandwidth_gbs = " eb; next }
    sec == "[links.inter_node]" && $1 == "latency_us" { print "latency_us = " el; next }
    sec == "[links.inter_node]" && $1 == "small_latency_us" { print "small_latency_us = " es; next }
    sec == "[nccl]" && $1 == "small_message_bytes" { print "small_message_bytes = " sb; next }
    sec == "[nccl]" && $1 == "base_latency_us" { print "base_latency_us = " base; next }
    sec == "[overlap]" && $1 == "compute_slowdown" { print "compute_slowdown = " sd; next }
    sec == "[overlap]" && $1 == "call_slowdown" { print "call_slowdown = " cs; next }
    { print }' "$out/raw.toml"
} > "$out/emulated$tag.toml"
cat > "$out/emulate$tag.env" <<EOF
k=$k
preset=$(basename "$preset" .toml)
precision=$precision
intra_intended_mbit=$intra_node_mbit
intra_intended_lat_us=$intra_node_lat_us
intra_link=$intra_link
intra_measured_mbit=$(calc "$m_intra_gbs * 8000")
intra_measured_oneway_us=$m_intra_oneway_us
intra_measured_alpha_us=$m_intra_alpha_us
inter_intended_mbit=$inter_node_mbit
inter_intended_lat_us=$inter_node_lat_us
inter_link=$inter_link
inter_measured_mbit=$(calc "$m_inter_gbs * 8000")
inter_measured_oneway_us=$m_inter_oneway_us
inter_measured_alpha_us=$m_inter_alpha_us
base_intended_us=$base_us
base_measured_us=$a_us
overlap_slowdown=$slowdown
overlap_call_slowdown=$call_slowdown
EOF
# What plan reads back: a file it would refuse is an error here.
"$bottle" plan "$root/configs/tiny.toml" --cluster "$out/emulated$tag.toml" --top 1 > /dev/null
echo "$out/emulated$tag.toml"
