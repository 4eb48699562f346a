#!/usr/bin/env bash
# Re-planning at run time over real shaped links (Comm::replanBalance,
# docs/topology-algorithms.md "Re-planning at run time"): 4 emulated nodes x
# 1 rank, every link shaped with tc tbf to --rate both ways. One
# communicator runs tutti-perf all_reduce of 4 MiB rows (results checked,
# -c 1), re-planning after every call (TUTTI_REPLAN_BYTES=4 MiB). Driven by
# the log, not by the clock:
#   - after the first rows, node 2's link is slowed to --slow-rate: rank 0
#     must log a re-plan giving rank 2 at least 90% of the vector;
#   - then the link is restored: rank 0 must log a re-plan back to equal
#     shares, before the run ends.
# Every rank exits 0 with no wrong value. (How fast it follows:
# bench/balance/follow.sh; timing is not asserted.)
#
# usage: replan_test.sh --perf PATH [--rate R] [--slow-rate R2]
# Exit: 0 passed, 1 failed, 77 skipped (no root, no ip, no namespaces).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/netns_lib.sh
source "$here/netns_lib.sh"

perf='' rate=100mbit slowRate=25mbit slow=2 rows=10
while (($# > 0)); do
  case $1 in
    --perf) perf=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow-rate) slowRate=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "replan_test.sh: --perf PATH is required" >&2; exit 2; }

netns_setup 4 "$rate"
# netns_run_ranks numbers its runs: the next one writes here.
dir=$NETNS_WORKDIR/run$((_NETNS_RUNS + 1))
log=$dir/rank0.log
NETNS_SHOW=0 NETNS_TIMEOUT=${NETNS_TIMEOUT:-300} netns_run_ranks 1,1,1,1 \
  env NCCL_ALGO=ring TUTTI_REPLAN_BYTES=4194304 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \
  "$perf" all_reduce -c 1 -b 4M -e 4M -n 1 -w 0 -N "$rows" >"$NETNS_WORKDIR/run.out" 2>&1 &
runner=$!

# (0 before the log exists.)
rowsDone() {
  local n
  n=$(grep -cE '^ +[0-9]+ +[0-9]+ +float ' "$log" 2>/dev/null) || true
  echo "${n:-0}"
}
replans() { grep -h "NCCL INFO balance: re-planned" "$log" 2>/dev/null | sed 's/.*NCCL INFO //' || true; }
# Waits until `cond` holds or the run ends; false when the run ended first.
waitFor() {
  while ! "$@"; do
    kill -0 "$runner" 2>/dev/null || return 1
    sleep 0.1
  done
}
twoRows() { (($(rowsDone) >= 2)); }
slowPlanned() { replans | grep -qE 'shares by rank: [^)]* 2:(9[0-9]|100)\.[0-9]%'; }
evenPlanned() { replans | grep -q '; ring: equal shares'; }

fail=0
if waitFor twoRows; then
  echo "after $(rowsDone) rows: node 2's link at $slowRate"
  netns_shape_node "$slow" "$slowRate"
  if waitFor slowPlanned; then
    echo "after $(rowsDone) rows: re-planned around node 2; its link back at $rate"
    netns_shape_node "$slow" "$rate"
    if waitFor evenPlanned; then
      echo "after $(rowsDone) rows: re-planned to equal shares"
    else
      echo "FAIL: no re-plan back to equal shares after the link was restored"
      fail=1
    fi
  else
    echo "FAIL: no re-plan giving rank 2 at least 90% of the vector while its link was slow"
    fail=1
  fi
else
  echo "FAIL: the run ended before two rows"
  fail=1
fi
rc=0
wait "$runner" || rc=$?
echo "rank 0's re-plans:"
replans | cut -c1-400 | sed 's/^/  /'
if ((rc != 0)); then
  echo "FAIL: tutti-perf failed (exit $rc):"
  tail -20 "$NETNS_WORKDIR/run.out"
  fail=1
fi
wrong=$(awk '/^ +[0-9]+ +[0-9]+ +float / && ($9 != 0 || $13 != 0)' "$log")
if [[ -n $wrong ]]; then
  echo "FAIL: wrong values: $wrong"
  fail=1
fi
((fail == 0)) && echo "PASS: the plan followed node 2 both ways, $(rowsDone) rows, values checked"
exit "$fail"
