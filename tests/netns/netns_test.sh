#!/usr/bin/env bash
# One ctest test of the emulated multi-node harness (docs/netns.md): tutti-perf
# with result checking (-c 1) on "nodes" that are network namespaces joined by
# a bridge, so ranks of different nodes talk over TCP through veth links and
# ranks of one node over shared memory.
#
# usage: netns_test.sh --perf PATH --nodes SPEC [options] COLLECTIVE...
#   --nodes SPEC      ranks per node, "2,2" (2 nodes x 2 ranks) or "1,2,3"
#   --algo A          export NCCL_ALGO=A (auto: leave it unset)
#   --dtypes "T..."   datatypes, one tutti-perf run each (default "float int32")
#   --ops "OP..."     operators for all_reduce, reduce_scatter, reduce (default "sum avg")
#   --rate R          shape each node's link to R in both directions (tc tbf)
#   --counters        also check, with the links' byte counters, that an all-reduce
#                     really crossed every node's link (see counter_check below)
#   --probe LO:HI     check the link probe at init (see probe_check below): the
#                     inter-node bandwidth rank 0 measured lies in LO..HI GB/s
# Every collective runs two sweeps per datatype and operator: sizes 0, 4, 16 ...
# 1M (-f 4) and two sizes that are no power of two (4004 and 1000012 bytes:
# 1001 and 250003 elements of 4 bytes, odd and not a multiple of any rank
# count). Rooted collectives use the last rank (on the last node) as root in
# the first sweep and every rank in turn (-r -1) in the second.
# Exit: 0 passed, 1 failed, 77 skipped (no root, no ip, no namespaces).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=SCRIPTDIR/netns_lib.sh
source "$here/netns_lib.sh"

perf='' spec='' algo='' rate='' counters=0 probe=''
dtypes='float int32' ops='sum avg'
colls=()
while (($# > 0)); do
  case $1 in
    --perf) perf=$2; shift 2 ;;
    --nodes) spec=$2; shift 2 ;;
    --algo) algo=$2; shift 2 ;;
    --dtypes) dtypes=$2; shift 2 ;;
    --ops) ops=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --counters) counters=1; shift ;;
    --probe) probe=$2; shift 2 ;;
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
    -*) echo "netns_test: unknown option $1" >&2; exit 2 ;;
    *) colls+=("$1"); shift ;;
  esac
done
[[ -n $perf && -n $spec ]] || { echo "usage: netns_test.sh --perf PATH --nodes SPEC COLL..." >&2; exit 2; }
[[ -x $perf ]] || { echo "netns_test: '$perf' is not an executable" >&2; exit 2; }
((${#colls[@]} > 0 || counters)) || [[ -n $probe ]] ||
  { echo "netns_test: no collective given" >&2; exit 2; }
if [[ -n $probe && ! $probe =~ ^[0-9.]+:[0-9.]+$ ]]; then
  echo "netns_test: --probe wants LO:HI in GB/s, got '$probe'" >&2
  exit 2
fi

IFS=, read -ra per <<<"$spec"
nodes=${#per[@]}
world=0
for n in "${per[@]}"; do world=$((world + n)); done
last=$((world - 1))

if [[ -n $algo && $algo != auto ]]; then
  export NCCL_ALGO=$algo
else
  unset NCCL_ALGO
fi
# Each rank gives up on its own well before ctest's timeout.
limit=(-T 60)
export NETNS_TIMEOUT=${NETNS_TIMEOUT:-90}
export NETNS_SHOW=0

t0=$SECONDS
netns_setup "$nodes" "$rate"
echo "netns_test: $nodes nodes ($spec ranks, $world in all), subnet $NETNS_SUBNET.0/24," \
  "NCCL_ALGO=${NCCL_ALGO:-<unset>}${rate:+, links shaped to $rate}; setup $((SECONDS - t0)) s"

failures=0
runs=0
# run ARGS...: one tutti-perf run on every rank; passes when every rank exits
# 0 and rank 0 reports no wrong results.
run() {
  local t=$SECONDS rc=0
  runs=$((runs + 1))
  netns_run_ranks "$spec" "$perf" "$@" "${limit[@]}" || rc=$?
  if ((rc == 0)) && grep -q '^# Out of bounds values : 0 OK' "$NETNS_RUN_DIR/rank0.log"; then
    echo "ok ($((SECONDS - t)) s): tutti-perf $*"
  else
    echo "FAIL (exit $rc): tutti-perf $*"
    if ((rc == 0)); then
      grep -v '^#  Rank' "$NETNS_RUN_DIR/rank0.log" | tail -n 25 | sed 's/^/    /'
    fi
    failures=$((failures + 1))
  fi
}

for coll in "${colls[@]}"; do
  case $coll in
    all_reduce | reduce_scatter | reduce) oplist=$ops ;;
    *) oplist='-' ;;
  esac
  case $coll in
    broadcast | reduce | gather | scatter) root=(-r "$last") roots=(-r -1) ;;
    *) root=() roots=() ;;
  esac
  for dt in $dtypes; do
    for op in $oplist; do
      opt=()
      [[ $op == - ]] || opt=(-o "$op")
      run "$coll" -b 0 -e 1M -f 4 -n 2 -w 1 -c 1 -d "$dt" "${opt[@]}" "${root[@]}"
      run "$coll" -b 4004 -e 1000012 -i 996008 -n 2 -w 1 -c 1 -d "$dt" "${opt[@]}" "${roots[@]}"
    done
  done
done

# counter_check: an all-reduce of S bytes, run K = 2n + 2 times (n timed
# out-of-place, n timed in-place, one checked run of each; -w 0: no warm-up;
# the TUNING log's count of operations replaces K if it differs),
# must move at least K*S bytes out of and into every node, whatever the
# algorithm. Each element of a node's result depends on the other nodes' inputs
# at that index, so at least one value derived from them (4 bytes: tutti does
# not compress by default) must enter the node for every element, i.e. S bytes
# received; likewise every other node's result depends on this node's input,
# so S bytes must leave it. (The best algorithms, reduce-scatter + all-gather
# between nodes, move 2(N-1)/N * S each way, which is S for 2 nodes; a flat ring
# over all ranks moves 2(W-1)/W * S over a node's link when the ring crosses it
# once each way.) The counters are the veths' L2 byte counts, so headers only
# add to them: the check is a lower bound and cannot fail for a correct library
# that really used the links. It does fail when ranks of different nodes
# bypassed the links (shared memory is visible across namespaces).
counter_check() {
  local S=$((4 << 20)) n=2 K i before after tx rx ok=1
  K=$((2 * n + 2))
  mapfile -t before < <(netns_counters)
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING run all_reduce -b "$S" -e "$S" -n "$n" -w 0 -c 1 -d float
  mapfile -t after < <(netns_counters)
  # What tutti says it ran (TUNING log of rank 0: one line per operation),
  # e.g. "algorithm ring"; the number of such lines is the number of calls.
  local logged
  logged=$(grep -c "AllReduce count $((S / 4)) float " "$NETNS_RUN_DIR/rank0.log" || true)
  grep -o "AllReduce count $((S / 4)) float .*algorithm .*" "$NETNS_RUN_DIR/rank0.log" |
    sed 's/.*: algorithm/  tutti ran: algorithm/' | sort -u || true
  if ((logged > 0 && logged != K)); then
    echo "  note: rank 0 logged $logged all-reduces of S bytes, not K = $K; using $logged"
    K=$logged
  fi
  echo "counter check: all_reduce of S=$S bytes, K=$K calls: every node's link must carry" \
    ">= K*S = $((K * S)) bytes each way"
  for ((i = 0; i < nodes; i++)); do
    read -r _ ifn tx0 rx0 <<<"${before[i]}"
    read -r _ _ tx1 rx1 <<<"${after[i]}"
    tx=$((tx1 - tx0))
    rx=$((rx1 - rx0))
    awk -v i="$i" -v f="$ifn" -v tx="$tx" -v rx="$rx" -v k="$K" -v s="$S" 'BEGIN {
      printf "  node %d (%s): tx %d bytes (%.2f S per call), rx %d bytes (%.2f S per call)\n",
        i, f, tx, tx / k / s, rx, rx / k / s }' 
    if ((tx < K * S || rx < K * S)); then
      echo "  FAIL: node $i's link carried less than K*S: the ranks did not talk through it"
      ok=0
    fi
  done
  ((ok)) || failures=$((failures + 1))
}
((counters)) && counter_check

# probe_check: at init the sending rank of each inter-node ring link measures
# it (core/link_probe.h) and rank 0 logs, at INFO under TUNING, what the cost
# model then uses (the upper median of the links' figures):
#   cost model: intra-node 1 us 5 GB/s (defaults), inter-node L us B GB/s (measured at init)
# B must lie in LO..HI (with --rate 1gbit: nominal 0.125 GB/s; tbf's 512 KiB burst
# may inflate the probe's 2 MiB transfer by up to 1.33 x, CPU load may slow it) and
# L must be positive. With TUTTI_LINK_PROBE=0 the defaults must stay.
probe_check() {
  local lo=${probe%%:*} hi=${probe##*:} line lat bw num='\([0-9.e+-]*\)'
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING run all_reduce -b 1K -e 1K -n 1 -w 0 -c 1 -d float
  grep -h 'link probe: ' "$NETNS_RUN_DIR"/rank*.log | sed 's/.*NCCL INFO /  /' || true
  line=$(grep -h 'cost model: ' "$NETNS_RUN_DIR/rank0.log" | sed 's/.*NCCL INFO //' || true)
  echo "  $line"
  read -r lat bw < <(sed -n "s/.*inter-node $num us $num GB\/s (measured at init).*/\1 \2/p" \
    <<<"$line") || true
  if [[ -z ${bw:-} ]] || ! awk -v l="$lat" -v b="$bw" -v lo="$lo" -v hi="$hi" \
    'BEGIN { exit !(l > 0 && b >= lo && b <= hi) }'; then
    echo "  FAIL: wanted a measured inter-node latency > 0 and bandwidth in $lo..$hi GB/s"
    failures=$((failures + 1))
  else
    echo "  ok: measured inter-node bandwidth $bw GB/s in $lo..$hi, latency $lat us"
  fi
  TUTTI_LINK_PROBE=0 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \
    run all_reduce -b 1K -e 1K -n 1 -w 0 -c 1 -d float
  if grep -q 'inter-node 20 us 1.25 GB/s (defaults)' "$NETNS_RUN_DIR/rank0.log"; then
    echo "  ok: TUTTI_LINK_PROBE=0 keeps the defaults"
  else
    echo "  FAIL: with TUTTI_LINK_PROBE=0 the cost model is not the defaults:"
    grep -h 'cost model: ' "$NETNS_RUN_DIR/rank0.log" | sed 's/^/    /' || true
    failures=$((failures + 1))
  fi
}
[[ -n $probe ]] && probe_check

echo "netns_test: $runs runs, $failures failed, $((SECONDS - t0)) s"
((failures == 0))
