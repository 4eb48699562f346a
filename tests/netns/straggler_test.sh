#!/usr/bin/env bash
# Straggler telemetry over real shaped links (core/telemetry.h, docs/api.md
# "Stragglers"): 4 emulated nodes x 1 rank, every link shaped with tc tbf,
# ring all-reduces (tutti-perf, NCCL_ALGO=ring, results checked).
#
# usage: straggler_test.sh --perf PATH [--rate R] [--slow NODE --slow-rate R2]
#   --rate R        every node's link, both directions (default 100mbit)
#   --slow NODE     that node's link runs at --slow-rate instead (default: none)
#   --slow-rate R2  (default 25mbit)
# With --slow: every rank's log holds a WARN "straggler: slow link" with
# rank NODE at one end, and none says a rank "arrives late" (a slow link is
# not taken for a slow rank). Without: no rank WARNs about stragglers (an
# even run names nobody), over 3 sizes x 41 operations.
# Exit: 0 passed, 1 failed, 77 skipped (no root, no ip, no namespaces).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/netns_lib.sh
source "$here/netns_lib.sh"

perf='' rate=100mbit slow=-1 slowRate=25mbit
while (($# > 0)); do
  case $1 in
    --perf) perf=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --slow-rate) slowRate=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "straggler_test.sh: --perf PATH is required" >&2; exit 2; }

netns_setup 4 "$rate"
if ((slow >= 0)); then
  netns_shape_node "$slow" "$slowRate"
  sizes=(-b 1M -e 1M -n 6 -w 1)
else
  sizes=(-b 4K -e 1M -f 16 -n 20 -w 1)
fi
export NCCL_ALGO=ring NCCL_DEBUG=WARN
NETNS_SHOW=0 netns_run_ranks 1,1,1,1 "$perf" all_reduce -c 1 "${sizes[@]}" || {
  echo "FAIL: tutti-perf failed (rank $NETNS_FAILED_RANK)"
  exit 1
}

fail=0
for ((r = 0; r < 4; ++r)); do
  log=$NETNS_RUN_DIR/rank$r.log
  warns=$(grep "NCCL WARN straggler" "$log" || true)
  if ((slow < 0)); then
    if [[ -n $warns ]]; then
      echo "FAIL: rank $r named a straggler on an even run: $warns"
      fail=1
    fi
    continue
  fi
  if ! grep -q "slow link from rank $slow (host\|to rank $slow (host" <<<"$warns"; then
    echo "FAIL: rank $r did not name a link of rank $slow: ${warns:-no straggler WARN}"
    fail=1
  fi
  if grep -q "arrives late" <<<"$warns"; then
    echo "FAIL: rank $r took the slow link for a late rank: $warns"
    fail=1
  fi
  echo "rank $r: ${warns:-(none)}" | cut -c1-300
done
exit $fail
