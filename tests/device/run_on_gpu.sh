#!/usr/bin/env bash
# run_on_gpu.sh [DIR]   (DIR: a gpu-pack from pack_for_gpu.sh, or a build dir;
#                        default: the folder this script is in if it is a pack)
#
# The CUDA backend's checks on a machine with an NVIDIA GPU, using binaries
# built elsewhere: no compiler, apt, hwloc, fmt or GoogleTest needed there (the
# pack carries their shared libraries; LD_LIBRARY_PATH points at them).
#   1. device_cuda_kernel_ops_test   kernel_ops.h vs the CPU reference (host only)
#   2. device_cuda_plugin_load_test  dlopen, table, init, smoke test on the GPU
#   3. cuda_plugin_check             every kernel on the GPU vs kernel_ops.h,
#                                    pointer queries, events, IPC (child process),
#                                    reduce bandwidth vs device-to-device memcpy
#   4. hooks for the core's tests (run when their binaries are in the pack)
# and prints a summary table LAST. Each step has a timeout; the whole run stays
# under 5 minutes on an H200. Exit status: 0 when no step failed.
set -uo pipefail
dir=${1:-$(cd "$(dirname "$0")" && pwd)}
dir=$(cd "$dir" && pwd)
if [[ -d $dir/bin ]]; then  # a pack
  bins=("$dir/bin") plugins=$dir/tutti libs=$dir/lib
else  # a build dir
  bins=("$dir/tests" "$dir/tests/device") plugins=$dir/tutti libs=$dir
fi
# exe NAME: the path of a test program, or a non-existent one.
exe() {
  local d
  for d in "${bins[@]}"; do
    [[ -x $d/$1 ]] && { echo "$d/$1"; return; }
  done
  echo "${bins[0]}/$1"
}
plugin=$plugins/libtutti-backend-cuda.so
[[ -f $plugin ]] || { echo "run_on_gpu: no $plugin" >&2; exit 2; }
export LD_LIBRARY_PATH=$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export TUTTI_CUDA_PLUGIN=$plugin TUTTI_PLUGIN_PATH=$plugins
log=$(mktemp -d)
declare -a rows=()

echo "== machine"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null ||
  echo "(nvidia-smi not available)"

# step NAME TIMEOUT CMD...: runs, keeps the output, records status and time.
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  local t0=$SECONDS rc
  timeout "$limit" "$@" >"$log/$name.out" 2>&1
  rc=$?
  tail -n 40 "$log/$name.out"
  local status=PASS
  if [[ $rc -eq 77 ]] || { [[ $rc -eq 0 ]] && grep -q "SKIPPED \]" "$log/$name.out"; }; then
    status=SKIP
  elif [[ $rc -eq 124 ]]; then
    status="FAIL (timeout ${limit}s)"
  elif [[ $rc -ne 0 ]]; then
    status="FAIL (exit $rc)"
  fi
  rows+=("$(printf '%-34s %-20s %4ss' "$name" "$status" $((SECONDS - t0)))")
}
missing() { rows+=("$(printf '%-34s %-20s' "$1" "TODO: $2")"); echo "== $1: TODO: $2"; }

step kernel_ops_vs_cpu_reference 60 "$(exe device_cuda_kernel_ops_test)" --gtest_brief=1
step plugin_load_and_smoke 60 "$(exe device_cuda_plugin_load_test)"
step kernels_on_gpu_and_bandwidth 240 "$(exe cuda_plugin_check)" --plugin "$plugin"

# ---- hooks: the core's device tests (built by the core team) ---------------------
# TODO(core): conformance of the cuda backend through tutti's Backend wrapper.
if [[ -x $(exe device_conformance_test) ]]; then
  TUTTI_CONFORMANCE_BACKENDS=cuda step conformance_cuda 120 "$(exe device_conformance_test)" \
    --gtest_brief=1
else
  missing conformance_cuda "device_conformance_test not in the pack"
fi
# TODO(core): collectives on device buffers, 2 and 4 ranks sharing one GPU.
if [[ -x $(exe device_collectives_test) ]]; then
  TUTTI_BACKEND_PLUGIN=cuda NCCL_SOCKET_IFNAME=lo step collectives_cuda 180 \
    "$(exe device_collectives_test)" --gtest_brief=1
else
  missing collectives_cuda_2_and_4_ranks "device_collectives_test not in the pack"
fi
# TODO(core): a program compiled against NVIDIA's nccl.h, run with
# LD_PRELOAD=libtutti.so on device buffers (its binary name is not fixed yet).
if [[ -x $(exe nccl_preload_cuda) ]]; then
  LD_PRELOAD=$libs/libtutti.so.0 step nvidia_nccl_h_preload 120 "$(exe nccl_preload_cuda)"
else
  missing nvidia_nccl_h_preload "LD_PRELOAD program not written yet"
fi

echo
echo "== bandwidth (cuda_plugin_check)"
sed -n '/^bandwidth/,/^$/p' "$log/kernels_on_gpu_and_bandwidth.out"
echo "== summary"
printf '%-34s %-20s %5s\n' step status time
fails=0
for r in "${rows[@]}"; do
  echo "$r"
  [[ $r == *FAIL* ]] && fails=$((fails + 1))
done
rm -rf "$log"
exit $((fails > 0))
