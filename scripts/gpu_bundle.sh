#!/usr/bin/env bash
# Builds bottle with the cuda backend on this (Debian 12) machine and packs what
# scripts/gpu_check.sh needs on a GPU machine whose image has the CUDA 13 toolkit and PyTorch
# but none of bottle's Debian libraries (oneDNN, Open MPI, fmt, toml++):
#   bin/   bottle, the GPU test programs and the GPU modules they open at run time, found beside
#          them (libbottle_cuda.so, libbottle_nccl.so: the only files that link CUDA's libraries)
#   lib/   every shared library they (and Open MPI's runtime) load, except glibc's and CUDA's:
#          the GPU machine's own driver, CUDA runtime, cuBLASLt and NCCL are used
#   ompi/  Open MPI's runtime (mpirun, orted, plugins, help files) at its Debian paths, which
#          OPAL_PREFIX relocates there
# Then packs the folder into BUNDLE.tar.xz (libdnnl alone is 40 MB: compressed, the whole
# bundle fits the device tool's 64 MiB carry).
#   scripts/gpu_bundle.sh [BUNDLE]        (default: gpu-bundle, ignored by git)
#   scripts/gpu_bundle.sh --check [BUNDLE] checks an existing BUNDLE.tar.xz: its size beside the
#                                         working tree within the device tool's 64 MiB carry,
#                                         and every file scripts/gpu_check.sh runs inside it
set -euo pipefail
cd "$(dirname "$0")/.."

# check_bundle TARBALL: what scripts/gpu_check.sh needs is in it, and the tree plus it travel.
check_bundle() {
  local tarball=$1 limit=$((64 << 20)) tree packed
  [ -f "$tarball" ] || { echo "gpu bundle: $tarball does not exist" >&2; return 1; }
  packed=$(stat -c %s "$tarball")
  tree=$(git ls-files -z | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
  local listing missing=()
  listing=$(tar -tJf "$tarball")
  local name
  for name in bin/bottle bin/test_device_ops bin/test_model_backends bin/libbottle_cuda.so \
    bin/libbottle_nccl.so lib/libdnnl.so.2 \
    lib/libfmt.so.9 ompi/usr/bin/orterun ompi/usr/bin/orted ompi/usr/bin/mpirun \
    ompi/etc/openmpi/openmpi-mca-params.conf; do
    grep -q "^[^/]*/$name\$" <<<"$listing" || missing+=("$name")
  done
  echo "gpu bundle: $tarball $((packed >> 20)) MiB packed ($packed bytes), with the working tree" \
    "$(((packed + tree) >> 20)) MiB of the 64 MiB a device call carries; $(wc -l <<<"$listing") entries"
  if ((${#missing[@]})); then
    echo "gpu bundle: missing from $tarball: ${missing[*]}" >&2
    return 1
  fi
  ((packed + tree <= limit)) || { echo "gpu bundle: over the 64 MiB carry" >&2; return 1; }
}
if [ "${1:-}" = --check ]; then
  check_bundle "${2:-gpu-bundle}.tar.xz"
  exit
fi
bundle=${1:-gpu-bundle}
build=${BOTTLE_GPU_BUILD:-build-cuda}  # an existing CUDA build may be reused
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DBOTTLE_NATIVE=OFF -DBOTTLE_CUDA=ON >/dev/null
cmake --build "$build" -j"$(nproc)" --target bottle bottle_cuda bottle_nccl test_device_ops \
  test_model_backends

rm -rf "$bundle" "$bundle.tar.xz"
mkdir -p "$bundle"/{bin,lib,ompi}
cp "$build/bottle" "$build/libbottle_cuda.so" "$build/libbottle_nccl.so" \
  "$build/tests/backend/test_device_ops" "$build/tests/model/test_model_backends" "$bundle/bin/"

# Open MPI's runtime at the paths `ompi_info --path all` reports (prefix /usr): OPAL_PREFIX
# moves every prefix-relative one, OPAL_SYSCONFDIR the configuration.
# PMIx's plugins and help files likewise (PMIX_INSTALL_PREFIX).
for path in /usr/bin/orterun /usr/bin/orted /usr/lib/x86_64-linux-gnu/openmpi /usr/share/openmpi \
  /etc/openmpi /usr/lib/x86_64-linux-gnu/pmix2; do
  mkdir -p "$bundle/ompi$(dirname "$path")"
  cp -a "$path" "$bundle/ompi$path"
done
ln -s orterun "$bundle/ompi/usr/bin/mpirun"
ln -s orterun "$bundle/ompi/usr/bin/mpiexec"

# Shared libraries: glibc's and the dynamic loader stay the machine's own (the GPU machine's
# glibc is newer, and binaries built against an older one run there); CUDA's come from the
# GPU machine's toolkit, which must match the driver.
system='^(linux-vdso|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|ld-linux|libcuda\.so|libcudart\.so|libcublas|libcublasLt|libcudnn|libnccl|libnvidia|libresolv\.so|libutil\.so)'
mapfile -t objects < <(find "$bundle/bin" "$bundle/ompi" -type f \( -perm -u+x -o -name '*.so*' \))
for object in "${objects[@]}"; do
  ldd "$object" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' || true
done | sort -u | while read -r name path; do
  [[ $name =~ $system ]] || cp -nL "$path" "$bundle/lib/$name"
done

tar -C "$(dirname "$bundle")" -cJf "$bundle.tar.xz" "$(basename "$bundle")"
echo "gpu bundle: $(du -sh "$bundle" | cut -f1) in $bundle, $(du -sh "$bundle.tar.xz" | cut -f1) packed in $bundle.tar.xz"
check_bundle "$bundle.tar.xz"
