#!/usr/bin/env bash
# From a fresh Debian 12 machine: install, build, turn the `fortunes` package's text into
# byte-level token shards, train the tiny CoLA model of configs/tiny.toml on the CPU (the
# loss falls below the corpus's byte-unigram entropy within a minute or two), write its
# checkpoint and loss plot under runs/tiny, and sample from it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh --app-only  # the demo runs bottle alone: not the test suite
corpus=$(find /usr/share/games/fortunes -maxdepth 1 -type f ! -name '*.dat' ! -name '*.u8' | sort)
# shellcheck disable=SC2086
build/bottle prepare --input $corpus --output data/fortunes
rm -rf runs/tiny  # the demo's own output: start it fresh each time
build/bottle train configs/tiny.toml
checkpoint=$(ls -d runs/tiny/step_* | tail -n 1)
build/bottle eval --checkpoint "$checkpoint" --data 'data/fortunes/data_val_*.bin' --batch 8 --seq 128
echo "loss plot: runs/tiny/loss.png"
build/bottle sample --checkpoint "$checkpoint" --prompt "The meaning of life is" --tokens 300 --temperature 0.8 --seed 7
