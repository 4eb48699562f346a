#!/usr/bin/env bash
# All-reduce over each network tutti has, side by side on this machine, every
# peer off shared memory (NCCL_SHM_DISABLE=1): tutti's TCP, tutti's UCX plugin
# over UCX's tcp (TUTTI_NET=ucx UCX_TLS=tcp, when built), tutti's libfabric
# plugin over libfabric's tcp and shm providers (TUTTI_NET=ofi
# FI_PROVIDER=tcp|shm, when built) and an NCCL net plugin (NCCL_NET_PLUGIN;
# default the test plugin, TCP on loopback), and tutti's own shared memory
# (shm, the reference for ofi-shm). Runs interleave (tcp, ucx, ofi-tcp,
# ofi-shm, plugin, shm, tcp, ...) so that a noisy machine hurts all
# alike; the table gives the median out-of-place time per size over the
# runs and each network's ratio to TCP (below 1: faster than TCP).
#   bench/net/run.sh [--np N] [--reps R] [-b MIN] [-e MAX] [--plugin FILE]
#                    [--baseline PERF]
# --baseline PERF: also time another tutti-perf (a build of another commit)
# over TCP and over shared memory, interleaved with this one: the before/after
# check of a change to the data path (ratios this/baseline).
# The ratio columns divide by tcp (ofi-shm also by shm).
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=2 REPS=5 MIN=8 MAX=64M BASE=
PLUGIN=$PWD/build/tests/netplugin/libnccl-net-tsock.so
while [ $# -gt 0 ]; do
  case $1 in
    --np) NP=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    -b) MIN=$2; shift 2 ;;
    -e) MAX=$2; shift 2 ;;
    --plugin) PLUGIN=$2; shift 2 ;;
    --baseline) BASE=$2; shift 2 ;;
    *) echo "usage: $0 [--np N] [--reps R] [-b MIN] [-e MAX] [--plugin FILE] [--baseline PERF]" >&2
       exit 2 ;;
  esac
done
PERF=build/bench/tutti_perf/tutti-perf
[ -x "$PERF" ] || { echo "$PERF not built (scripts/setup.sh)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name | program | environment
CASES=("tcp|$PERF|NCCL_SHM_DISABLE=1 TUTTI_NET=tcp")
[ -e build/tutti/libtutti-net-ucx.so ] &&
  CASES+=("ucx|$PERF|NCCL_SHM_DISABLE=1 TUTTI_NET=ucx UCX_TLS=tcp")
[ -e build/tutti/libtutti-net-ofi.so ] &&
  CASES+=("ofi-tcp|$PERF|NCCL_SHM_DISABLE=1 TUTTI_NET=ofi FI_PROVIDER=tcp"
          "ofi-shm|$PERF|NCCL_SHM_DISABLE=1 TUTTI_NET=ofi FI_PROVIDER=shm")
[ -e "$PLUGIN" ] &&
  CASES+=("plugin|$PERF|NCCL_SHM_DISABLE=1 NCCL_NET_PLUGIN=$PLUGIN")
CASES+=("shm|$PERF|")
if [ -n "$BASE" ]; then
  CASES+=("base-tcp|$BASE|NCCL_SHM_DISABLE=1" "base-shm|$BASE|")
fi

# "<size> <oop us>" per row of one tutti-perf table.
run() {
  local perf=$1 envs=$2
  env NCCL_SOCKET_IFNAME=lo $envs "$perf" all_reduce -b "$MIN" -e "$MAX" -f 4 --np "$NP" 2>&1 |
    awk '$1 ~ /^[0-9]+$/ && NF >= 9 { print $1, $6 }'
}
for ((r = 0; r < REPS; r++)); do
  for c in "${CASES[@]}"; do
    IFS='|' read -r name perf envs <<< "$c"
    run "$perf" "$envs" > "$tmp/$name.$r"
  done
done
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
names=()
for c in "${CASES[@]}"; do names+=("${c%%|*}"); done
echo "# all_reduce, $NP ranks, out-of-place us, median of $REPS interleaved runs ($(nproc) CPUs, $(date -u +%F))"
printf '%10s' bytes
for n in "${names[@]}"; do printf ' %10s' "$n"; done
for n in "${names[@]:1}"; do
  case $n in base-*|shm) ;; *) printf ' %10s' "$n/tcp" ;; esac
done
[[ " ${names[*]} " == *" ofi-shm "* ]] && printf ' %12s' ofi-shm/shm
[ -n "$BASE" ] && printf ' %12s %12s' tcp/base shm/base
echo
for size in $(awk '{ print $1 }' "$tmp/tcp.0"); do
  declare -A med=()
  printf '%10s' "$size"
  for n in "${names[@]}"; do
    med[$n]=$(cat "$tmp/$n".* | awk -v s="$size" '$1 == s { print $2 }' | median)
    printf ' %10s' "${med[$n]}"
  done
  for n in "${names[@]:1}"; do
    case $n in base-*|shm) ;; *) awk -v a="${med[$n]}" -v b="${med[tcp]}" 'BEGIN { printf " %10.2f", a / b }' ;; esac
  done
  if [ -n "${med[ofi-shm]:-}" ]; then
    awk -v a="${med[ofi-shm]}" -v b="${med[shm]}" 'BEGIN { printf " %12.2f", a / b }'
  fi
  if [ -n "$BASE" ]; then
    awk -v a="${med[tcp]}" -v b="${med[base-tcp]}" -v c="${med[shm]}" -v d="${med[base-shm]}" \
      'BEGIN { printf " %12.3f %12.3f", a / b, c / d }'
  fi
  echo
  unset med
done
