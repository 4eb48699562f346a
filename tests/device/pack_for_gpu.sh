#!/usr/bin/env bash
# pack_for_gpu.sh BUILD_DIR [OUT_DIR]
#
# Collects what tests/device/run_on_gpu.sh needs on a GPU machine that has the
# NVIDIA driver but none of this machine's libraries (no hwloc, fmt, GoogleTest):
# the CUDA plugin, the device test binaries built in BUILD_DIR, and every shared
# library they load that is not part of glibc or the NVIDIA driver (found with
# ldd), into one folder (default BUILD_DIR/gpu-pack):
#   OUT/bin/    test programs (debug info stripped)
#   OUT/lib/    their non-system shared libraries (libstdc++ included, so a
#               target with an older one still runs them), libtutti.so*
#   OUT/tutti/  backend plugins (libtutti-backend-*.so), as TUTTI_PLUGIN_PATH
#   OUT/nccl/   tutti's libnccl.so.2: it answers the libnccl.so.2 that
#               nccl_preload_cuda (built against NVIDIA's nccl.h and library)
#               needs, since NVIDIA's own (about 200 MB) is not carried;
#               LD_PRELOAD=libtutti.so.0 still puts tutti first
#   OUT/run_on_gpu.sh
# Prints the folder and its size; fails if the CUDA plugin was not built.
set -euo pipefail
build=${1:?usage: pack_for_gpu.sh BUILD_DIR [OUT_DIR]}
build=$(cd "$build" && pwd)
out=${2:-$build/gpu-pack}
here=$(cd "$(dirname "$0")" && pwd)

plugin=$build/tutti/libtutti-backend-cuda.so
[[ -f $plugin ]] || { echo "pack_for_gpu: $plugin not built (cmake --build $build --target tutti_backend_cuda)" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/tutti" "$out/nccl"

# Test programs, when built (the core's device tests are optional here).
progs=(cuda_plugin_check device_cuda_plugin_load_test device_cuda_kernel_ops_test
       device_conformance_test nccl_preload_cuda tutti-perf)
for p in "${progs[@]}"; do
  for d in "$build/tests" "$build/tests/device" "$build/tests/abi" "$build/bench/tutti_perf"; do
    if [[ -x $d/$p ]]; then
      cp "$d/$p" "$out/bin/"
      break
    fi
  done
done
# The device collectives tests are one program built once per variant, its
# backend chosen by TUTTI_BACKEND_PLUGIN at run time: the cpu variant serves
# (run_on_gpu.sh sets TUTTI_BACKEND_PLUGIN=cuda).
if [[ -x $build/tests/device/device_collectives_test_cpu ]]; then
  cp "$build/tests/device/device_collectives_test_cpu" "$out/bin/device_collectives_test"
fi
cp "$build"/tutti/libtutti-backend-*.so "$out/tutti/"
for f in "$build"/libtutti.so*; do
  [[ -e $f ]] && cp -P "$f" "$out/lib/"
done
for f in "$build"/tutti-nccl/libnccl.so*; do
  [[ -e $f ]] && cp -P "$f" "$out/nccl/"
done
cp "$here/run_on_gpu.sh" "$out/"
chmod +x "$out/run_on_gpu.sh"

# Shared libraries that are neither glibc's nor the driver's (nor libnccl.so.2:
# tutti's is in OUT/nccl).
is_system() {
  case "$(basename "$1")" in
    libc.so*|libm.so*|libdl.so*|librt.so*|libpthread.so*|ld-linux*|libresolv.so*|\
    libutil.so*|libcuda.so*|libnvidia*|linux-vdso*|libnccl.so*) return 0 ;;
  esac
  return 1
}
for f in "$out"/bin/* "$out"/tutti/*.so "$out"/lib/libtutti.so* "$out"/nccl/libnccl.so*; do
  [[ -e $f ]] || continue
  ldd "$f" 2>/dev/null | awk '/=> \// { print $3 }' | while read -r lib; do
    is_system "$lib" && continue
    [[ -e $out/lib/$(basename "$lib") ]] || cp -L "$lib" "$out/lib/"
  done
done
# The tests find the plugin through the path compiled in (BUILD_DIR), which the
# GPU machine may not have: run_on_gpu.sh passes the packed one explicitly.
strip --strip-debug "$out"/bin/* "$out"/lib/*.so* "$out"/tutti/*.so "$out"/nccl/*.so* 2>/dev/null ||
  true
echo "packed into $out ($(du -sh "$out" | cut -f1)):"
(cd "$out" && find . -type f | sort | sed 's/^/  /')
