#!/usr/bin/env bash
# Installs what bottle needs to build, test and compare, from Debian 12's packages.
set -euo pipefail
packages=(
  build-essential cmake pkg-config
  libdnnl-dev                      # GEMMs (oneDNN)
  libfmt-dev nlohmann-json3-dev libcli11-dev libtomlplusplus-dev
  libgtest-dev libbenchmark-dev
  openmpi-bin libopenmpi-dev       # tensor / pipeline / data parallelism
  python3-torch python3-numpy      # the PyTorch reference the tests compare against
  libopenblas0-openmp              # a real BLAS under PyTorch (Debian's default is netlib's)
  gnuplot-nox                      # plots
  fortunes                         # text for the demo corpus
  clang libclang-rt-14-dev libomp-dev  # libFuzzer targets (tools/fuzz.sh)
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${missing[@]}"
fi
