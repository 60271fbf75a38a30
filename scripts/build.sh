#!/usr/bin/env bash
# Configures and builds bottle into build/ (Release): every target, or with --app-only the
# bottle program alone (what scripts/demo.sh runs; the test suite is ~45 more programs).
set -euo pipefail
cd "$(dirname "$0")/.."
target=()
case "${1:-}" in
  "") ;;
  --app-only) target=(--target bottle) ;;
  *) echo "usage: scripts/build.sh [--app-only]" >&2; exit 2 ;;
esac
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" "${target[@]}"
