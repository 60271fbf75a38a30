#!/usr/bin/env bash
# Installs what bottle needs to build, test and compare, from Debian 12's packages.
set -euo pipefail
cd "$(dirname "$0")/.."
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
  libsentencepiece-dev             # SentencePiece .model tokenizers
  libpcre2-dev                     # the tokenizers' split regexes (GPT-2, LLaMA-3, tiktoken)
  libzstd-dev zlib1g-dev zstd      # compressed corpora for bottle prepare (.zst, .gz)
  python3-venv                     # .venv: the tokenizer oracles (tests/tokenizer_oracle.py)
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

# .venv: the reference tokenizer libraries, pinned, for the tokenizer oracle test and the
# benchmark peer (tests/tokenizer_oracle.py, tools/hf_tokenize_peer.py); nothing that builds or
# runs bottle uses it. Made with Debian's Python; made again if a pinned version is missing.
# sentencepiece stays at 0.2.1: 0.2.2 breaks ties between equal-scoring unigram segmentations
# ("f"+"ff" or "ff"+"f") the other way from Debian's libsentencepiece 0.1.97, which bottle links.
venv_packages=(tokenizers==0.23.3 sentencepiece==0.2.1 tiktoken==0.14.0)
venv_ok() {
  [ -x .venv/bin/python ] && .venv/bin/python - "${venv_packages[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
sys.exit(any(version(name) != want for name, want in (p.split("==") for p in sys.argv[1:])))
PY
}
if ! venv_ok; then
  echo "setup: installing into .venv: ${venv_packages[*]}"
  [ -x .venv/bin/python ] || /usr/bin/python3 -m venv --clear .venv
  .venv/bin/python -m pip install -q --disable-pip-version-check "${venv_packages[@]}"
  venv_ok || { echo "setup: .venv still lacks ${venv_packages[*]}" >&2; exit 1; }
fi
