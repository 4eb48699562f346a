#!/usr/bin/env bash
# The balanced ring over real shaped links (algo/balance.h, Comm::planBalance):
# 4 emulated nodes x 1 rank, every link shaped with tc tbf to --rate both
# ways, node 2's to --slow-rate. tutti-perf all_reduce of 4 MiB, results
# checked (-c 1), run twice on new communicators:
#   - defaults: rank 0 logs a plan giving node 2 at least 90% of the vector,
#     and the 4 MiB all-reduces run as "balanced ring";
#   - TUTTI_BALANCE=0: rank 0 logs "balance: off (TUTTI_BALANCE=0)" and they
#     run as the ring.
# (How much faster it is: bench/balance/run.sh; timing is not asserted.)
#
# usage: balance_test.sh --perf PATH [--rate R] [--slow-rate R2]
# Exit: 0 passed, 1 failed, 77 skipped (no root, no ip, no namespaces).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/netns_lib.sh
source "$here/netns_lib.sh"

perf='' rate=100mbit slowRate=25mbit slow=2
while (($# > 0)); do
  case $1 in
    --perf) perf=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow-rate) slowRate=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "balance_test.sh: --perf PATH is required" >&2; exit 2; }

netns_setup 4 "$rate"
netns_shape_node "$slow" "$slowRate"

fail=0
for balance in 1 0; do
  NETNS_SHOW=0 netns_run_ranks 1,1,1,1 env NCCL_ALGO=ring TUTTI_BALANCE=$balance \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING "$perf" all_reduce -c 1 -b 4M -e 4M -n 1 -w 0 || {
    echo "FAIL: tutti-perf failed with TUTTI_BALANCE=$balance (rank $NETNS_FAILED_RANK)"
    exit 1
  }
  log=$NETNS_RUN_DIR/rank0.log
  plan=$(grep -h "NCCL INFO balance: " "$log" | sed 's/.*NCCL INFO //' || true)
  algos=$(grep -h "AllReduce count 1048576 float on 4 ranks: algorithm" "$log" |
    sed 's/.*algorithm //; s/ (run-time tuning: [a-z ]*)$//' | sort | uniq -c || true)
  echo "TUTTI_BALANCE=$balance: ${plan:-no plan line}"
  echo "  4 MiB all-reduces ran as: ${algos:-nothing logged}"
  if ((balance)); then
    share=$(sed -n 's/.*shares by rank: [^)]* 2:\([0-9.]*\)%.*/\1/p' <<<"$plan")
    if ! awk -v s="${share:-0}" 'BEGIN { exit !(s >= 90) }'; then
      echo "FAIL: node 2 should own at least 90% of the vector, plan: ${plan:-none}"
      fail=1
    fi
    want="balanced ring (NCCL_ALGO=ring)"
  else
    if [[ $plan != "balance: off (TUTTI_BALANCE=0)"* ]]; then
      echo "FAIL: TUTTI_BALANCE=0 should log that balancing is off, got: ${plan:-none}"
      fail=1
    fi
    want="ring (NCCL_ALGO=ring)"
  fi
  if [[ $(awk '{ $1 = ""; sub(/^ /, ""); print }' <<<"$algos") != "$want" ]]; then
    echo "FAIL: wanted every 4 MiB all-reduce to run as '$want'"
    fail=1
  fi
done
exit $fail
