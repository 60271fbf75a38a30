# shellcheck shell=bash
# tools/cluster/args.sh: the checks of arguments and output directories that cluster.sh,
# emulate.sh, bench_emulated.sh and bench_overlap.sh share (sourced, not run; issue 57). Each
# check returns, or calls the sourcing script's `die` with one line that names the option and
# what it takes: a tool refuses a bad argument before it makes anything, rather than failing
# minutes later on what the argument became (an unbound variable, a division by 0, an awk
# syntax error).

args_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
# shellcheck disable=SC2034 # read by the scripts that source this
{
  max_nodes=16 # one /24 per node inside a cluster's /20
  max_ranks=64 # per node
  # cluster.sh up writes this file into its state directory before anything else, and down
  # removes the files of a cluster only where it finds it: the other names (config, hosts,
  # agent, ...) may be a user's own.
  cluster_marker=.made-by-cluster
}

# need_value OPTION [NEXT...]: called with the arguments left ("$@") at an option that takes
# a value; dies unless one follows. A next word that is itself an option, or the -- before a
# command, is no value: `--nodes --state DIR` would otherwise take "--state" for the node count.
need_value() {
  (($# >= 2)) || die "$1 needs a value"
  [[ $2 != --* ]] || die "$1 needs a value (found $2)"
}

# whole VAR OPTION MIN [MAX]: the variable VAR, given as OPTION, must hold a whole number from
# MIN (to MAX); it is stored back in decimal, as bash's arithmetic would read "08" as octal.
whole() {
  local _value=${!1} _range=", $3 or more"
  [[ -z ${4-} ]] || _range=" from $3 to $4"
  if ! [[ $_value =~ ^[0-9]{1,9}$ ]] || ((10#$_value < $3)) ||
    { [[ -n ${4-} ]] && ((10#$_value > $4)); }; then
    die "$2 '$_value': give a whole number$_range"
  fi
  printf -v "$1" '%d' "$((10#$_value))"
}

# number OPTION VALUE [positive]: a decimal number (digits, a point and digits), 0 or more, or
# above 0 with "positive".
number() {
  local what="a number, 0 or more"
  [[ ${3-} != positive ]] || what="a number above 0"
  if ! [[ $2 =~ ^[0-9]{1,9}(\.[0-9]{1,9})?$ ]] ||
    { [[ ${3-} == positive ]] && ! awk -v v="$2" 'BEGIN { exit !(v > 0) }'; }; then
    die "$1 '$2': give $what"
  fi
}

# one_of OPTION VALUE CHOICE...: VALUE must be one of the choices.
one_of() {
  local option=$1 value=$2 choice list=''
  shift 2
  for choice; do [[ $value != "$choice" ]] || return 0; done
  while (($# > 2)); do list+="$1, "; shift; done
  list+=${2:+"$1 or $2"}
  die "$option '$value': give ${list:-$1}"
}

# key_value OPTION VALUE: KEY=VALUE, as bottle's --set takes it.
key_value() {
  [[ $2 =~ ^[A-Za-z_][A-Za-z0-9_.]*= ]] || die "$1 '$2': give KEY=VALUE (e.g. training.seq_len=128)"
}

# input_file OPTION PATH: a regular file that can be read.
input_file() {
  [[ -f $2 && -r $2 ]] || die "$1 '$2': no such file (a readable regular file is needed)"
}

# parse_rate BANDWIDTH [OPTION]: bits per second of a bandwidth (0 for none).
parse_rate() {
  local s=${1,,}
  s=${s%/s}
  case $s in '' | none | 0) echo 0; return ;; esac
  [[ $s =~ ^([0-9]+(\.[0-9]+)?)(kbit|mbit|gbit)$ ]] ||
    die "${2:+$2: }bandwidth '$1': give N kbit, mbit or gbit (bits per second), or none"
  awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
    'BEGIN { m = u == "kbit" ? 1e3 : u == "mbit" ? 1e6 : 1e9; printf "%.0f\n", n * m }'
}

# parse_delay LATENCY [OPTION]: nanoseconds of a latency (0 for none).
parse_delay() {
  local s=${1,,}
  s=${s/µs/us}
  case $s in '' | none | 0) echo 0; return ;; esac
  [[ $s =~ ^([0-9]+(\.[0-9]+)?)(us|ms|s)$ ]] ||
    die "${2:+$2: }latency '$1': give N us, ms or s (one way), or none"
  awk -v n="${BASH_REMATCH[1]}" -v u="${BASH_REMATCH[3]}" \
    'BEGIN { m = u == "us" ? 1e3 : u == "ms" ? 1e6 : 1e9; printf "%.0f\n", n * m }'
}

# parse_link TIER SPEC OPTION: sets TIER_bits and TIER_ns from OPTION's value SPEC.
parse_link() {
  local bw=none lat=none extra='' bits ns
  if [[ ${2,,} != none ]]; then
    IFS=, read -r bw lat extra <<<"$2"
    [[ -z $extra ]] || die "$3 '$2': give BANDWIDTH[,LATENCY] or none"
  fi
  bits=$(parse_rate "$bw" "$3 '$2'")
  ns=$(parse_delay "${lat:-none}" "$3 '$2'")
  printf -v "${1}_bits" '%s' "$bits"
  printf -v "${1}_ns" '%s' "$ns"
}

# toml FILE SECTION KEY: the value of KEY in [SECTION] of a TOML file ("key = value" on one
# line, a comment after it dropped), or nothing.
toml() {
  awk -v sec="[$2]" -v key="$3" '
    /^\[/ { in_sec = ($1 == sec) }
    in_sec && $1 == key && $2 == "=" { v = $3; sub(/#.*/, "", v); print v; exit }' "$1"
}

# preset VAR OPTION PRECISION: the variable VAR holds a preset's name (clusters/NAME.toml) or
# a cluster file; it must name one that holds every figure emulate.sh dilates, each a number
# (a bandwidth, a rate, the efficiency above 0), and VAR is set to the file's path.
preset() {
  local _file=${!1} _entry _section _key _least _names=()
  [[ -f $_file ]] || _file=$args_root/clusters/$_file.toml
  if ! [[ -f $_file && -r $_file ]]; then
    for _entry in "$args_root"/clusters/*.toml; do _names+=("$(basename "$_entry" .toml)"); done
    die "$2 '${!1}': no such cluster file or preset (clusters/: ${_names[*]})"
  fi
  # Each figure, and whether it may be 0 ("0 or more") or not ("above 0").
  for _entry in "gpu ${3}_tflops above 0" "efficiency gemm above 0" \
    "links.intra_node bandwidth_gbs above 0" "links.intra_node latency_us 0 or more" \
    "links.inter_node bandwidth_gbs above 0" "links.inter_node latency_us 0 or more" \
    "nccl base_latency_us 0 or more"; do
    read -r _section _key _least <<<"$_entry"
    if ! awk -v v="$(toml "$_file" "$_section" "$_key")" -v above="${_least%% *}" 'BEGIN {
        exit !(v ~ /^[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ && (above != "above" || v + 0 > 0)) }'; then
      die "$2 '${!1}': not a cluster file emulate.sh can use: $_key in [$_section] is no number $_least (see clusters/a100-perlmutter.toml)"
    fi
  done
  printf -v "$1" '%s' "$_file"
}

# check_out_dir OPTION DIR TOOL: DIR may become TOOL's output directory: it does not exist, it
# is empty, or TOOL made it (it holds .made-by-TOOL). A directory with other files is
# refused: the tool writes and removes fixed names in it (data/, corpus.txt, table.txt, run
# folders), which would replace or delete a user's own.
check_out_dir() {
  [[ ! -e $2 || -d $2 ]] || die "$1 $2: not a directory"
  [[ -d $2 && ! -f $2/.made-by-$3 ]] || return 0
  [[ -z $(find "$2" -mindepth 1 -maxdepth 1 -print -quit 2>/dev/null) ]] ||
    die "$1 $2: a directory with files not made by $3.sh: give a new or empty directory"
}

# make_out_dir DIR TOOL: creates DIR, checked by check_out_dir, and marks it as TOOL's.
make_out_dir() {
  mkdir -p "$1"
  : >>"$1/.made-by-$2"
}
