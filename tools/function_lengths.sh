#!/usr/bin/env bash
# Lists the functions of the C++ and CUDA sources longer than a limit, longest first, and exits 1
# when there is one: a long function is a sign that a piece of it wants a name of its own.
#   tools/function_lengths.sh [--all] [LIMIT] [DIR...]     (defaults: 150 lines, src)
# --all lists every function with its length, for before/after figures. A function's extent is
# universal-ctags' (its first line to its closing brace, comments and blank lines inside it
# included); a lambda counts towards the function that holds it and is not listed apart.
set -euo pipefail
all=0
if [ "${1:-}" = --all ]; then
  all=1
  shift
fi
limit=150
if [[ ${1:-} =~ ^[0-9]+$ ]]; then
  limit=$1
  shift
fi
cd "$(dirname "$0")/.."
dirs=("$@")
((${#dirs[@]} > 0)) || dirs=(src)
if ! { command -v ctags >/dev/null && ctags --version 2>/dev/null | grep -q Universal; }; then
  echo "function_lengths: needs universal-ctags (apt-get install universal-ctags)" >&2
  exit 2
fi
# end, first line, name, file of every function definition; CUDA sources read as C++, with
# __launch_bounds__(...) skipped (it would be taken for its kernel's name).
list=$(ctags -x --_xformat='%{end} %n %N %F' --kinds-C++=f --fields=+ne \
  --langmap=C++:+.cu.cuh --languages=C++ -I '__launch_bounds__+' -R "${dirs[@]}" |
  awk '$1 > 0 && $3 !~ /^__anon/ { print $1 - $2 + 1, $4 ":" $2, $3 }' | sort -k1,1nr -k2,2)
if ((all)); then
  echo "$list"
  exit 0
fi
# Functions allowed over the limit, each with its reason: "FILE NAME  # why".
allowed=(
  # Every split tried changes its SASS (compared per kernel with the cubins of sm_90), and a
  # tensor-core kernel is only re-split where a GPU can time it and check its bits.
  "src/backend/cuda/attention_mma.cu tc_forward_kernel"
)
long=$(awk -v limit="$limit" '$1 > limit' <<<"$list")
for entry in "${allowed[@]}"; do
  file=${entry%% *} name=${entry#* }
  long=$(awk -v file="$file" -v name="$name" '!(index($2, file ":") == 1 && $3 == name)' <<<"$long")
  [ -z "$(awk -v limit="$limit" -v file="$file" -v name="$name" \
    '$1 > limit && index($2, file ":") == 1 && $3 == name' <<<"$list")" ] ||
    echo "function_lengths: allowed over $limit lines: $name ($file)"
done
if [ -n "$long" ]; then
  echo "function_lengths: $(wc -l <<<"$long") function(s) over $limit lines (lines, place, name):"
  echo "$long"
  exit 1
fi
echo "function_lengths: no function over $limit lines in ${dirs[*]}"
