#!/usr/bin/env bash
# Issue 28's rank-death table: tests/mp/death_shrink.cc (8 forked ranks, one
# killed by SIGKILL at a random moment of a loop of random collectives up to
# 16 MiB; every survivor must error within 5 s naming it, with TUTTI_TIMEOUT
# at 20 s, then ncclCommShrink(..., NCCL_SHRINK_ABORT) and exact results on
# the new communicator) for -t trials over shared memory and over TCP. The
# test suite runs 5 of each (ctest mp.death_shrink.*).
#
#   bench/fault/death_shrink.sh [-t trials] [-n ranks] [-s seed] [-b builddir] [-g dir]
# -g dir: every thread's stack of a hung survivor (gdb) into dir.
# Prints each trial, then the table:
#   case | trials | errored in time | hung | crashed | wrong data | worst detection
# Exit status 0 when every trial passed.
set -euo pipefail
cd "$(dirname "$0")/../.."
trials=100 ranks=8 seed=$(date +%s) build=build
stacks=
while getopts "t:n:s:b:g:" o; do
  case $o in
    t) trials=$OPTARG ;;
    n) ranks=$OPTARG ;;
    s) seed=$OPTARG ;;
    b) build=$OPTARG ;;
    g) stacks=$OPTARG ;;
    *) exit 2 ;;
  esac
done
bin=$build/tests/mp/mp_death_shrink
[ -x "$bin" ] || { echo "no $bin: build the tests first (scripts/setup.sh or cmake --build $build)" >&2; exit 2; }
out=$(mktemp -d /tmp/tutti-death.XXXXXX)
rc=0
for mode in shm tcp; do
  env=(NCCL_SOCKET_IFNAME=lo TUTTI_TIMEOUT=20)
  [ $mode = tcp ] && env+=(NCCL_SHM_DISABLE=1)
  [ -n "$stacks" ] && mkdir -p "$stacks" && env+=(DEATH_SHRINK_STACKS_DIR="$stacks")
  env "${env[@]}" "$bin" --ranks "$ranks" --trials "$trials" --seed "$seed" \
    --label "rank death + shrink, $mode" > "$out/$mode" 2>&1 || rc=1
  grep '^trial' "$out/$mode"
done
echo
echo "case | trials | errored in time | hung | crashed | wrong data | worst detection"
for mode in shm tcp; do tail -n 1 "$out/$mode"; done
rm -rf "$out"
exit $rc
