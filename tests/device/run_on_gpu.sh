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
#   4. device_conformance_test       the conformance suite on the cuda backend
#   5. device_collectives_test       every collective on cudaMalloc buffers, ranks
#                                    as threads (1, 2, 3, 5) sharing the GPU
#   6. nccl_preload_cuda 2 and 4     a program built against NVIDIA's nccl.h and
#                                    libnccl.so.2, on cudaMalloc buffers and streams,
#                                    with LD_PRELOAD=libtutti.so: 2 and 4 processes
#                                    sharing one GPU, exact checks, then timed
#   7. tutti-perf --mem device       all_reduce 2 and 4 processes, 8 B to 256 MiB
# (steps 4-7 run when their binaries are in the pack; a missing one is a row
# saying so)
# and prints a summary table LAST. Each step has a timeout; the whole run stays
# under 5 minutes on an H200. Exit status: 0 when no step failed.
set -uo pipefail
dir=${1:-$(cd "$(dirname "$0")" && pwd)}
dir=$(cd "$dir" && pwd)
if [[ -d $dir/bin ]]; then  # a pack
  bins=("$dir/bin") plugins=$dir/tutti libs=$dir/lib nccl=$dir/nccl
else  # a build dir
  bins=("$dir/tests" "$dir/tests/device" "$dir/tests/abi" "$dir/bench/tutti_perf")
  plugins=$dir/tutti libs=$dir nccl=$dir/tutti-nccl
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
missing() { rows+=("$(printf '%-34s %-20s' "$1" "MISSING: $2")"); echo "== $1: MISSING: $2"; }
skipped() { rows+=("$(printf '%-34s %-20s' "$1" "SKIP: $2")"); echo "== $1: SKIP: $2"; }

step kernel_ops_vs_cpu_reference 60 "$(exe device_cuda_kernel_ops_test)" --gtest_brief=1
step plugin_load_and_smoke 60 "$(exe device_cuda_plugin_load_test)"
step kernels_on_gpu_and_bandwidth 240 "$(exe cuda_plugin_check)" --plugin "$plugin"
# cuda_plugin_check exits 77 without a usable GPU; the steps below then only
# say so instead of failing one by one.
gpu=1
[[ ${rows[-1]} == *SKIP* ]] && gpu=0

# ---- tutti itself on the GPU ------------------------------------------------------
if [[ $gpu -eq 0 ]]; then
  for name in conformance_cuda collectives_cuda nvidia_nccl_h_preload tutti_perf_device; do
    skipped "$name" "no usable GPU (see kernels_on_gpu_and_bandwidth)"
  done
else
  if [[ -x $(exe device_conformance_test) ]]; then
    TUTTI_CONFORMANCE_BACKENDS=cuda step conformance_cuda 120 "$(exe device_conformance_test)" \
      --gtest_brief=1
  else
    missing conformance_cuda "device_conformance_test not in the pack"
  fi
  # In a build dir the program is device_collectives_test_cpu (one build per
  # ctest variant; the backend comes from TUTTI_BACKEND_PLUGIN).
  coll=$(exe device_collectives_test)
  [[ -x $coll ]] || coll=$(exe device_collectives_test_cpu)
  if [[ -x $coll ]]; then
    TUTTI_BACKEND_PLUGIN=cuda NCCL_SOCKET_IFNAME=lo step collectives_cuda 180 "$coll" \
      --gtest_brief=1
  else
    missing collectives_cuda "device_collectives_test not in the pack"
  fi
  # An unmodified NCCL program: DT_NEEDED libnccl.so.2 is answered by tutti's (in
  # $nccl) and LD_PRELOAD puts libtutti.so first; the program itself checks that
  # its NCCL calls resolve to tutti. TUTTI_BACKEND_PLUGIN stays unset, so tutti
  # picks the CUDA plugin on its own, as it would for a user.
  if [[ -x $(exe nccl_preload_cuda) ]]; then
    for n in 2 4; do
      LD_PRELOAD=$libs/libtutti.so.0 LD_LIBRARY_PATH=$nccl:$LD_LIBRARY_PATH NCCL_SOCKET_IFNAME=lo \
        step "nvidia_nccl_h_preload_np$n" 240 "$(exe nccl_preload_cuda)" "$n"
    done
  else
    missing nvidia_nccl_h_preload "nccl_preload_cuda not in the pack"
  fi
  if [[ -x $(exe tutti-perf) ]]; then
    for n in 2 4; do
      TUTTI_BACKEND_PLUGIN=cuda NCCL_SOCKET_IFNAME=lo step "tutti_perf_device_np$n" 120 \
        "$(exe tutti-perf)" all_reduce --np "$n" --mem device -b 8 -e 256M -f 8 -n 20 -w 3 -c 1
    done
  else
    missing tutti_perf_device "tutti-perf not in the pack"
  fi
fi

echo
echo "== bandwidth (cuda_plugin_check)"
sed -n '/^bandwidth/,/^$/p' "$log/kernels_on_gpu_and_bandwidth.out"
for n in 2 4; do
  if [[ -f $log/tutti_perf_device_np$n.out ]]; then
    echo "== tutti-perf all_reduce --mem device, $n processes on one GPU"
    grep -E '^ *#? *(size|[0-9])' "$log/tutti_perf_device_np$n.out" | head -n 20
  fi
done
echo "== NCCL program on cudaMalloc buffers (LD_PRELOAD=libtutti.so)"
cat "$log"/nvidia_nccl_h_preload_np*.out 2>/dev/null | grep '^perf:' || echo "(no perf lines)"
echo "== summary"
printf '%-34s %-20s %5s\n' step status time
fails=0
for r in "${rows[@]}"; do
  echo "$r"
  [[ $r == *FAIL* ]] && fails=$((fails + 1))
done
rm -rf "$log"
exit $((fails > 0))
