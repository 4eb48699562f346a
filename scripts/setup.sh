#!/usr/bin/env bash
# Installs what a fresh Debian 12 machine lacks to build tutti, then configures
# and builds it into ./build (or $TUTTI_BUILD_DIR). Safe to run repeatedly:
# packages already present are not touched, and the build is incremental.
set -euo pipefail
cd "$(dirname "$0")/.."

# Everything the build, the tests and the quick start use, so that a fresh
# Debian 12 machine passes `bash scripts/test.sh` (tools/fresh-machine-diff in
# the workplace lists what a machine has beyond this). CMake still treats all
# but hwloc and fmt as optional: a missing one turns its feature off at
# configure time and its tests skip with the reason.
# - hwloc: libhwloc-dev, plus libhwloc-plugins (hwloc's PCI discovery and its
#   libxml2 XML reader: without it TUTTI_TOPO_FILE reads only hwloc's own output).
# - MPI: libopenmpi-dev and openmpi-bin (tutti-perf under mpirun, mp.perf_launchers).
# - tutti-perf -J (JSON) and --plot: nlohmann-json3-dev, python3-matplotlib.
# - PyTorch backend (src/pytorch, ctest label torch): python3-torch,
#   libtorch-dev and pybind11-dev (which python3-torch only recommends).
# - Level Zero plugin (backends/ze): libze-dev (headers; the loader is opened
#   at run time) and clang-14 + llvm-spirv-14 to compile its kernels to SPIR-V
#   (spirv-tools validates it); its kernels are tested on the CPU under PoCL
#   through OpenCL (pocl-opencl-icd, ocl-icd-opencl-dev, opencl-c-headers;
#   clinfo shows the platform).
# - libsodium-dev: the keyed challenge-response of every connection (required).
# - Fuzzing (tests/fuzz, scripts/fuzz.sh, ctest fuzz.short): clang-14 and
#   libclang-rt-14-dev (libFuzzer and clang's sanitizer runtimes; clang-14
#   only recommends it).
# - UCX network plugin (transports/ucx, TUTTI_NET=ucx): libucx-dev; ucx-utils
#   (ucx_info) to see which UCX transports a machine has.
# - libfabric network plugin (transports/ofi, TUTTI_NET=ofi): libfabric-dev;
#   libfabric-bin (fi_info) to see which providers a machine has.
PKGS=(build-essential cmake pkg-config libsodium-dev libhwloc-dev libhwloc-plugins libfmt-dev libgtest-dev
      googletest libbenchmark-dev iproute2 procps libopenmpi-dev openmpi-bin
      nlohmann-json3-dev python3-matplotlib python3-torch libtorch-dev pybind11-dev
      libze-dev clang-14 libclang-rt-14-dev llvm-spirv-14 spirv-tools pocl-opencl-icd ocl-icd-opencl-dev
      opencl-c-headers clinfo libucx-dev ucx-utils libfabric-dev libfabric-bin)

missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "tutti setup: installing ${missing[*]}"
  SUDO=""
  if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

BUILD_DIR="${TUTTI_BUILD_DIR:-build}"
JOBS="${TUTTI_JOBS:-$(nproc)}"
cmake -S . -B "$BUILD_DIR" -DCMAKE_BUILD_TYPE="${TUTTI_BUILD_TYPE:-RelWithDebInfo}" \
  ${TUTTI_CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
