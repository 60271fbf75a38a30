#!/bin/sh
# Runs the full-disk cases ("$@", a test program and its filter) where a small tmpfs can be
# mounted; where it cannot (no root, no CAP_SYS_ADMIN) exits 77, ctest's skip code for these
# tests, saying why. Probing here rather than skipping inside GoogleTest keeps a failure
# before a case's mount a failure: a skip pattern matched in the output would hide it.
probe=$(mktemp -d "${TMPDIR:-/tmp}/bottle-disk-probe.XXXXXX") || exit 1
trap 'umount "$probe" 2> /dev/null; rmdir "$probe"' EXIT
if ! why=$(mount -t tmpfs -o size=65536 bottle-test-disk "$probe" 2>&1); then
  echo "skipped: cannot mount a tmpfs for a full disk: $why"
  exit 77
fi
umount "$probe"
# Every SmallDisk of the cases must mount now; one that does not fails its case.
BOTTLE_REQUIRE_SMALL_DISK=1 "$@"
