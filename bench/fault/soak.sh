#!/usr/bin/env bash
# The long soak (issue 28): tests/mp/soak.cc over shared memory and over TCP
# for -s seconds each (or -r rounds): rounds of 1 to 8 forked ranks running
# random collectives (five kinds, five datatypes, sum/max/min, 1 B to
# -m bytes), groups, point-to-point rings and splits, every result checked;
# every -k-th round one rank is killed at a random step. The suite runs 6
# rounds of each (ctest mp.soak.*).
#
#   bench/fault/soak.sh [-s seconds] [-r rounds] [-k kill-every] [-m max-bytes]
#                       [-e seed] [-b builddir]
# Prints the failed rounds, then the table:
#   case | rounds | ranks | calls checked | kills (met) | errored in time | hung |
#   crashed | wrong data | worst detection
# Exit status 0 when nothing was wrong, hung or crashed.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=300 rounds=1000000 kill=3 maxbytes=$((4 << 20)) seed=$(date +%s) build=build
while getopts "s:r:k:m:e:b:" o; do
  case $o in
    s) seconds=$OPTARG ;;
    r) rounds=$OPTARG ;;
    k) kill=$OPTARG ;;
    m) maxbytes=$OPTARG ;;
    e) seed=$OPTARG ;;
    b) build=$OPTARG ;;
    *) exit 2 ;;
  esac
done
bin=$build/tests/mp/mp_soak
[ -x "$bin" ] || { echo "no $bin: build the tests first (scripts/setup.sh or cmake --build $build)" >&2; exit 2; }
out=$(mktemp -d /tmp/tutti-soak.XXXXXX)
rc=0
for mode in shm tcp; do
  env=(NCCL_SOCKET_IFNAME=lo TUTTI_TIMEOUT=20)
  [ $mode = tcp ] && env+=(NCCL_SHM_DISABLE=1)
  env "${env[@]}" "$bin" --rounds "$rounds" --seconds "$seconds" --kill-every "$kill" \
    --max-bytes "$maxbytes" --seed "$seed" --label "soak, $mode" > "$out/$mode" 2>&1 || rc=1
  grep '^round' "$out/$mode" | grep -v ': ok' || true
done
echo
echo "case | rounds | ranks | calls checked | kills (met) | errored in time | hung | crashed | wrong data | worst detection"
for mode in shm tcp; do tail -n 1 "$out/$mode"; done
rm -rf "$out"
exit $rc
