#!/usr/bin/env bash
# One tutti-perf run on device memory (--mem device, docs/tutti-perf.md):
# passes when it exits 0, reports no wrong results, and its device header
# says every rank used <backend>'s device memory (so a backend that silently
# fell back elsewhere fails).
#
# usage: perf_mem_device.sh <backend> <path to tutti-perf> <tutti-perf args...>
#   <backend> "cpu" runs with TUTTI_BACKEND_PLUGIN unset (the built-in CPU
#   backend); any other name is expected to be set in TUTTI_BACKEND_PLUGIN.
#   PERF_MEM_EXPECT_IPC=1 (0) also requires that every rank's communicator
#   runs its collectives device to device (that none does), from the
#   "device IPC:" INFO line of the SHM log subsystem.
#   PERF_MEM_EXPECT_DEVICES="0 1 0" also requires the device column of the
#   header, rank by rank (the device each rank's communicator is bound to:
#   local rank % the backend's device count).
set -u

backend=${1:?usage: perf_mem_device.sh <backend> <tutti-perf> <args...>}
perf=${2:?usage: perf_mem_device.sh <backend> <tutti-perf> <args...>}
shift 2
if [[ ! -x $perf ]]; then
  echo "perf_mem_device: '$perf' is not an executable" >&2
  exit 2
fi
if [[ $backend == cpu ]]; then
  unset TUTTI_BACKEND_PLUGIN
elif [[ ${TUTTI_BACKEND_PLUGIN:-} != "$backend" ]]; then
  echo "perf_mem_device: TUTTI_BACKEND_PLUGIN='${TUTTI_BACKEND_PLUGIN:-}', expected '$backend'" >&2
  exit 2
fi

expect_ipc=${PERF_MEM_EXPECT_IPC:-}
if [[ -n $expect_ipc ]]; then
  export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=SHM
fi
out=$("$perf" "$@" 2>&1)
rc=$?
printf '%s\n' "$out"
fail=""
if [[ $rc -ne 0 ]]; then
  fail="exit code $rc"
elif ! grep -q "^# Out of bounds values : 0 OK" <<<"$out"; then
  fail="no '# Out of bounds values : 0 OK' line"
else
  ranks=$(grep -c "^#  Rank .* device .*\[$backend\] $backend device memory$" <<<"$out")
  all=$(grep -c "^#  Rank " <<<"$out")
  if [[ $all -eq 0 || $ranks -ne $all ]]; then
    fail="$ranks of $all ranks report '[$backend] $backend device memory'"
  elif [[ -n ${PERF_MEM_EXPECT_DEVICES:-} ]] &&
       [[ $(grep "^#  Rank " <<<"$out" | sed -E 's/.* device +([0-9-]+) .*/\1/' | xargs) != "$PERF_MEM_EXPECT_DEVICES" ]]; then
    fail="devices $(grep "^#  Rank " <<<"$out" | sed -E 's/.* device +([0-9-]+) .*/\1/' | xargs), expected $PERF_MEM_EXPECT_DEVICES"
  elif [[ -n $expect_ipc ]]; then
    ipc=$(grep -c "NCCL INFO device IPC: collectives" <<<"$out")
    if [[ $expect_ipc == 1 && $ipc -ne $all ]]; then
      fail="$ipc of $all ranks run collectives device to device"
    elif [[ $expect_ipc == 0 && $ipc -ne 0 ]]; then
      fail="$ipc ranks run collectives device to device, expected none"
    fi
  fi
fi
if [[ -n $fail ]]; then
  echo "perf_mem_device: FAIL ($fail): $perf $*"
  exit 1
fi
echo "perf_mem_device: ok ($backend): $perf $*"
