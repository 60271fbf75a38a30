#!/usr/bin/env bash
# Fails (exit 1, one "file:line: what" per finding) when a layer of src/ includes a layer that
# is not below it (docs/design.md §2): the floors point one way, and layers on one floor do not
# include each other. CMake's libraries enforce this only where a symbol is missing at link
# time; a header-only use would slip through, so the includes are read here.
#   tools/check_layers.sh [ROOT]        check ROOT/src (default: this repository)
#   tools/check_layers.sh --self-test   also prove it catches a planted upward include
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

# The floors, lowest first; a layer may include its own floor's files only from itself.
floors=(
  "core"
  "sys io backend"
  "comm data nn"
  "parallel pipeline"
  "model"
  "train"
  "plan"
  "bench"
  "apps"
)

# Prints "layer: allowed layers" for every layer: itself and every layer of a lower floor.
allowed_table() {
  local below="" floor layer
  for floor in "${floors[@]}"; do
    for layer in $floor; do echo "$layer:$layer $below"; done
    below="$below $floor"
  done
}

check() {
  local root=$1 found=0 entry layer allowed file line target rel
  while IFS= read -r entry; do
    layer=${entry%%:*}
    allowed=" ${entry#*:} "
    [ -d "$root/src/$layer" ] || continue
    while IFS= read -r -d '' file; do
      rel=${file#"$root"/}
      while IFS= read -r line; do
        target=$(sed -E 's/^[0-9]+:[[:space:]]*#[[:space:]]*include[[:space:]]*"([a-z_]+)\/.*/\1/' <<<"$line")
        [ -d "$root/src/$target" ] || continue  # not one of ours (e.g. "nlohmann/json.hpp")
        if [[ $allowed != *" $target "* ]]; then
          echo "$rel:${line%%:*}: $layer includes $target/, which is not below it: ${line#*:}"
          found=1
        fi
      done < <(grep -nE '^[[:space:]]*#[[:space:]]*include[[:space:]]*"[a-z_]+/' "$file" || true)
    done < <(find "$root/src/$layer" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \
               -o -name '*.cuh' -o -name '*.def' -o -name '*.in' \) -print0 | sort -z)
  done < <(allowed_table)
  # Every folder of src/ must have a floor, so that a new layer is placed deliberately. (The
  # table is read whole first: grep -q quitting early would fail its writer under pipefail.)
  local table
  table=$(allowed_table)
  for file in "$root"/src/*/; do
    layer=$(basename "$file")
    if ! grep -q "^$layer:" <<<"$table"; then
      echo "src/$layer/: a layer with no floor in tools/check_layers.sh"
      found=1
    fi
  done
  if [ "$found" = 1 ]; then
    echo "check_layers: a layer includes one that is not below it (docs/design.md §2)" >&2
    return 1
  fi
}

if [ "${1:-}" = --self-test ]; then
  # shellcheck source=tools/lib/planted_self_test.sh
  source "$here/tools/lib/planted_self_test.sh"
  planted_self_test check_layers '#include "train/trainer.h"  // planted' "upward include"
fi
check "${1:-$here}"
echo "check_layers: ok"
