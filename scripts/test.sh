#!/usr/bin/env bash
# From a fresh Debian 12 machine: install, build, run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh
ctest --test-dir build --output-on-failure
