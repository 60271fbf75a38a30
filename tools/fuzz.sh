#!/usr/bin/env bash
# Builds the libFuzzer targets of tools/fuzz (clang, ASan + UBSan) in build-fuzz/ and runs each
# for SECONDS (default 60), starting from its committed seeds in tools/fuzz/corpus/. Fails on
# the first crash, hang, leak or sanitizer report; the input that caused it is left in
# build-fuzz/ as crash-* / timeout-* / leak-* (replay: build-fuzz/tools/fuzz/fuzz_NAME FILE).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
targets=(safetensors hf_config token_shard train_config tokenizer cluster)
# -O1 without NDEBUG: fast enough to fuzz, and nlohmann-json's own assertions stay on. (No
# ccache: clang 14 behind it failed on this build with garbled built-in macros.)
cmake -S . -B build-fuzz -DBOTTLE_FUZZ=ON -DBOTTLE_CUDA=OFF -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Fuzz \
  -DCMAKE_CXX_FLAGS="-O1 -g -Wno-pass-failed" >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target "${targets[@]/#/fuzz_}"
for t in "${targets[@]}"; do
  # New inputs go to a scratch corpus, never into the committed seeds.
  mkdir -p "build-fuzz/corpus/$t"
  echo "== fuzz_$t for $seconds s"
  build-fuzz/tools/fuzz/"fuzz_$t" -max_total_time="$seconds" -timeout=10 -max_len=65536 \
    -print_final_stats=1 -artifact_prefix="build-fuzz/" "build-fuzz/corpus/$t" \
    "tools/fuzz/corpus/$t"
done
echo "fuzz: ${#targets[@]} targets, $seconds s each, no crash"
