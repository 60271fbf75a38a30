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
  dict-gcide                       # dictionary text for the optimizer race (tools/optimizer_race.sh)
  clang libclang-rt-14-dev libomp-dev  # libFuzzer targets (tools/fuzz.sh)
  libsentencepiece-dev             # SentencePiece .model tokenizers
  libpcre2-dev                     # the tokenizers' split regexes (GPT-2, LLaMA-3, tiktoken)
  libzstd-dev zlib1g-dev zstd      # compressed corpora for bottle prepare (.zst, .gz)
  python3-venv                     # .venv: the tokenizer oracles (tests/data/tokenizer_oracle.py)
  liblapacke-dev                   # bottle lowrank: truncated SVDs (LAPACK's dgesdd)
  jq                               # scripts/plan_check.sh: predictions beside bench tp's JSON
  universal-ctags                  # tools/function_lengths.sh: the functions' extents
  bsdutils                         # script(1): a terminal for the progress-line test
  python3-pip unzip                # the cudnn-frontend headers below (a PyPI wheel)
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

# .venv: the reference tokenizer libraries and TensorBoard, pinned, for the oracle tests and the
# benchmark peer (tests/data/tokenizer_oracle.py, tools/hf_tokenize_peer.py); nothing that builds or
# runs bottle uses it. Made with Debian's Python; made again if a pinned version is missing.
# sentencepiece stays at 0.2.1: 0.2.2 breaks ties between equal-scoring unigram segmentations
# ("f"+"ff" or "ff"+"f") the other way from Debian's libsentencepiece 0.1.97, which bottle links.
# tensorboard: its own reader checks bottle's event files (tests/train/tensorboard_oracle.py).
venv_packages=(tokenizers==0.23.3 sentencepiece==0.2.1 tiktoken==0.14.0 tensorboard==2.21.0)
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

# .venv-hf: transformers for the HF round trip (tests/interop/hf_oracle.py), on Debian's PyTorch 1.13
# (system site packages). transformers 4.45.2 is the newest whose generate() runs on it (4.46
# imports torch.distributed.fsdp there, which Debian's torch cannot import on Python 3.11); its
# tokenizers must be 0.20.x, so it cannot share .venv with the tokenizer oracles.
hf_packages=(transformers==4.45.2 tokenizers==0.20.3 huggingface_hub==0.36.2 safetensors==0.8.0
  sentencepiece==0.2.1 protobuf==7.36.2)
hf_venv_ok() {
  [ -x .venv-hf/bin/python ] && .venv-hf/bin/python - "${hf_packages[@]}" <<'PY' 2>/dev/null
import sys
from importlib.metadata import version
import torch  # Debian's, through the system site packages
sys.exit(any(version(name) != want for name, want in (p.split("==") for p in sys.argv[1:])))
PY
}
if ! hf_venv_ok; then
  echo "setup: installing into .venv-hf: ${hf_packages[*]}"
  [ -x .venv-hf/bin/python ] || /usr/bin/python3 -m venv --system-site-packages --clear .venv-hf
  .venv-hf/bin/python -m pip install -q --disable-pip-version-check "${hf_packages[@]}"
  hf_venv_ok || { echo "setup: .venv-hf still lacks ${hf_packages[*]} (or torch)" >&2; exit 1; }
fi

# .deps/cudnn-frontend: NVIDIA's header-only cudnn-frontend C++ API, through which the cuda
# backend runs cuDNN's SDPA attention (src/backend/cuda/attention_cudnn.cpp). Debian has no
# package; PyPI's wheel ships the headers (include/), pinned here. Only the headers are
# unpacked, never committed; a version stamp says what is there, and only a missing or other
# version is fetched again. CMake finds them (CUDNN_FRONTEND_INCLUDE_DIR); without them the
# cuda backend builds without cuDNN attention.
cudnn_frontend_version=1.32.0
cudnn_frontend_dir=.deps/cudnn-frontend
if [ "$(cat "$cudnn_frontend_dir/VERSION" 2>/dev/null)" != "$cudnn_frontend_version" ]; then
  echo "setup: installing cudnn-frontend $cudnn_frontend_version headers into $cudnn_frontend_dir"
  wheel_dir=$(mktemp -d)
  trap 'rm -rf "$wheel_dir"' EXIT
  /usr/bin/python3 -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
    --python-version 3.11 --platform manylinux_2_28_x86_64 \
    -d "$wheel_dir" "nvidia-cudnn-frontend==$cudnn_frontend_version"
  wheel=$(ls "$wheel_dir"/nvidia_cudnn_frontend-"$cudnn_frontend_version"-*.whl)
  rm -rf "$cudnn_frontend_dir"
  mkdir -p "$cudnn_frontend_dir"
  unzip -q "$wheel" 'include/*' -d "$cudnn_frontend_dir"
  [ -f "$cudnn_frontend_dir/include/cudnn_frontend.h" ] ||
    { echo "setup: $wheel has no include/cudnn_frontend.h" >&2; exit 1; }
  echo "$cudnn_frontend_version" >"$cudnn_frontend_dir/VERSION"
fi
