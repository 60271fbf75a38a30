#!/usr/bin/env bash
# The GPU window's rehearsal (ctest gpu_window): scripts/gpu_check.sh --rehearse runs without a
# GPU on the binaries of BUILD_DIR. Checks that every GPU stage reports skipped with its reason
# (or ran, on a machine with a GPU), that the rehearsal's cpu bench rows fill the summary's
# figures, that the outputs fit what the device tool returns (at most 8 plain files with plain
# names), and that the stage budgets fit a window: a-d within 8 minutes, --quick within 4.
#   tools/test_gpu_window.sh BUILD_DIR
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:?usage: tools/test_gpu_window.sh BUILD_DIR}" && pwd)
tmp=$(mktemp -d /tmp/bottle-gpu-window.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAILED: $*" >&2; exit 1; }

# Budgets, from the script's own table.
budgets=$("$root/scripts/gpu_check.sh" --budgets)
echo "$budgets"
full=$(awk '$1 ~ /^[abcd]$/ {s += $2} END {print s}' <<<"$budgets")
quick=$(awk '$1 ~ /^[a-g]$/ {s += $3} END {print s}' <<<"$budgets")
((full <= 480)) || fail "stages a-d budget $full s, over 8 minutes"
((quick <= 240)) || fail "--quick budget $quick s, over 4 minutes"
echo "budgets: a-d $full s, --quick $quick s"

# A wrong option is refused.
rc=0
"$root/scripts/gpu_check.sh" --no-such-option >/dev/null 2>&1 || rc=$?
((rc == 2)) || fail "an unknown option exited $rc, not 2"

# The rehearsal.
rc=0
OUT=$tmp/out GPU_CHECK_WORK=$tmp/work BOTTLE_BUILD_DIR=$build \
  "$root/scripts/gpu_check.sh" --rehearse >"$tmp/log" 2>&1 || rc=$?
cat "$tmp/log"
((rc == 0)) || fail "the rehearsal exited $rc"
python3 - "$tmp/out" <<'PY'
import json, os, re, sys
out = sys.argv[1]
files = sorted(os.listdir(out))
assert len(files) <= 8, f"{len(files)} files under $OUT, the device tool returns 8: {files}"
for f in files:
    assert re.fullmatch(r"[A-Za-z0-9._-]+", f) and os.path.isfile(os.path.join(out, f)), f
assert set(files) == {"summary.json", "window.log", "stages.log", "bench.jsonl"}, files
s = json.load(open(os.path.join(out, "summary.json")))
assert s["rehearsal"] is True
for letter in "abcdefg":
    st = s["stages"][letter]["status"]
    assert st.startswith("skipped: ") or st == "ok", (letter, st)
    assert s["stages"][letter]["budget_s"] > 0, letter
assert s["stages"]["r"]["status"] == "ok", s["stages"]["r"]
for kind in ("cola", "none"):
    k = s[kind]
    for field in ("step_ms", "mfu_nominal", "ops_per_step", "attention_ms_per_step", "kernel_ms_per_step"):
        assert isinstance(k[field], (int, float)) and k[field] > 0, (kind, field, k[field])
    assert k["backend"] == "cpu", k
    assert k["attention"], k
    for field in ("host_waits_per_step", "torch_eager_ms", "speedup_vs_eager", "torch_compile_ms",
                  "speedup_vs_compile", "mfu_measured_peak"):
        assert field in k, (kind, field)
assert isinstance(s["cola_vs_full_rank"], float)
assert len(s["targets"]) == 6 and all(v.startswith("not measured") for v in s["targets"].values()), s["targets"]
print("summary fields:", ", ".join(sorted(s["cola"])))
PY
grep -q '^===== stage r: ' "$tmp/out/stages.log" || fail "stages.log lacks stage r"
echo "gpu window rehearsal: ok"
