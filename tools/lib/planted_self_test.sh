# shellcheck shell=bash
# Sourced by the repository checks (tools/check_*.sh) for their --self-test: the check passes on
# this tree, then fails on a copy of src/ with one line planted in src/parallel/mappings.h and
# names that line. The caller defines check ROOT (0: clean; 1 and "file:line: ..." findings)
# and `here`, the repository root.
# shellcheck disable=SC2154 # here: the caller's
#   planted_self_test NAME PLANTED_LINE WHAT   (WHAT: "hook", "raw access", for the messages)
planted_self_test() {
  local name=$1 planted=$2 what=$3 tmp out
  check "$here"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp -r "$here/src" "$tmp/src"
  echo "$planted" >> "$tmp/src/parallel/mappings.h"
  if out=$(check "$tmp" 2>&1); then
    echo "$name: the self-test's planted $what was not caught" >&2
    exit 1
  fi
  grep -q '^src/parallel/mappings.h:[0-9]*:.*planted' <<<"$out" || {
    echo "$name: the self-test's finding does not name the planted line: $out" >&2
    exit 1
  }
  echo "$name: ok (the tree is clean; a planted $what was caught: ${out%%$'\n'*})"
  exit 0
}
