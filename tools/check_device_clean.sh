#!/usr/bin/env bash
# Fails (exit 1, one "file:line: what" per finding) when code outside the backends reads or
# writes tensor data itself (docs/design.md, "Where memory lives"). Layers, the model, the
# trainer and the apps go through Backend: copy / copy_columns, sums, from_host / to_host.
#   tools/check_device_clean.sh [ROOT]        check ROOT/src (default: this repository)
#   tools/check_device_clean.sh --self-test   also prove it catches a planted raw access
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)

# Files allowed to touch host tensor data, each with its reason.
allowed=(
  # The backends: the only code that reads or writes tensor data.
  'src/backend/'
  # Below them: the host memory source zeroes what it hands out, and the numeric formats
  # convert host buffers (bf16_convert).
  'src/core/'
  # File formats read and write host buffers, which their callers stage through a backend;
  # the system's host loops (sys/host_parallel.h) are OpenMP's.
  'src/io/'
  'src/sys/'
  # Open MPI moves and reduces host buffers by definition; a device run uses its own
  # communicator (NCCL), which takes device pointers.
  'src/comm/mpi_communicator.cpp'
  # Text and token ids in host containers: the data layer has no tensors (it needs only
  # core's errors); the trainer stages its tokens through the backend.
  'src/data/'
)

# Typed access to tensor data, raw copies, and OpenMP loops of their own.
patterns=(
  '\.(f32|i32|bf16)\(\)'
  '\bstd::(memcpy|memset|memmove)\b|\b(memcpy|memset|memmove)\('
  '#[[:space:]]*pragma[[:space:]]+omp'
  # A host container wrapped as a tensor: host staging goes through host_tensor() (comm, I/O).
  'Tensor[[:space:]]*\{[^}]*\.data\(\)'
  '(static|reinterpret)_cast<[[:space:]]*(const[[:space:]]+)?(float|int32_t|uint16_t|std::byte|char)[[:space:]]*\*[[:space:]]*>\([^()]*\.data\)'
)

check() {
  local root=$1 found=0 file rel line
  while IFS= read -r -d '' file; do
    rel=${file#"$root"/}
    for prefix in "${allowed[@]}"; do [[ $rel == "$prefix"* ]] && continue 2; done
    for pattern in "${patterns[@]}"; do
      # Comment lines say why; only code counts.
      while IFS= read -r line; do
        echo "$rel:$line"
        found=1
      done < <(grep -nE "$pattern" "$file" | grep -vE '^[0-9]+:[[:space:]]*//' || true)
    done
  done < <(find "$root/src" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \) -print0 | sort -z)
  if [ "$found" = 1 ]; then
    echo "check_device_clean: tensor data touched outside the backends (src/backend); go through Backend" >&2
    return 1
  fi
}

if [ "${1:-}" = --self-test ]; then
  # shellcheck source=tools/lib/planted_self_test.sh
  source "$here/tools/lib/planted_self_test.sh"
  planted_self_test check_device_clean 'inline void planted(bottle::Tensor t) { t.f32()[0] = 1.0f; }' "raw access"
fi
check "${1:-$here}"
echo "check_device_clean: ok"
