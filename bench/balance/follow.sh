#!/usr/bin/env bash
# The balanced plan following a node that turns slow in the middle of a run
# and recovers (issue 27; docs/performance.md "Re-planning at run time";
# Comm::replanBalance).
#
# Each "node" is a network namespace (tests/netns/netns_lib.sh) whose link
# is shaped with tc tbf to --rate both ways. One communicator per mode runs
# tutti-perf all_reduce of --size float32 for --rows rows (-N: each row one
# out-of-place and one in-place call, results unchecked); --slow-at seconds
# after the ranks start, node --slow's link is reshaped to --slow-rate, and
# --back-at seconds after that back to --rate. The modes, one after the
# other on the same links:
#   static     NCCL_ALGO=ring TUTTI_BALANCE=0 (equal segments)
#   balanced   defaults (balancing on, the algorithm chosen by the cost
#              model, re-planning every TUTTI_REPLAN_BYTES: every call at 64 MiB)
# The table: each row's times (seconds, out-of-place and in-place) per mode,
# and which phase the row started in (even, slow, back: from tutti-perf's
# timestamps); then the median of each phase's rows after its first
# --settle rows, and rank 0's re-plan lines.
#
# usage: bench/balance/follow.sh [options]
#   --nodes SPEC      ranks per node of the 4 nodes (1,1,1,1)
#   --rate R          every node's link (1gbit)
#   --slow N          the node that turns slow (2); --slow-rate R2 (250mbit)
#   --size S          bytes per all-reduce (64M)
#   --rows K          tutti-perf rows (22); --slow-at T (8); --back-at T (45)
#   --settle K        rows left out of each phase's median (2)
#   --rounds K        run the modes K times, side by side (1); the row table
#                     shows the first round, the medians take every round's rows
#   --modes M         comma list of static, balanced (static,balanced)
#   --perf PATH       tutti-perf (default: build/bench/tutti_perf/tutti-perf)
#   --out DIR         keep the raw outputs there (default: a temporary directory)
# Needs root (network namespaces); exits 77 when they cannot be made.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=SCRIPTDIR/../../tests/netns/netns_lib.sh
source "$root/tests/netns/netns_lib.sh"

spec=1,1,1,1 rate=1gbit slow=2 slow_rate=250mbit size=64M rows=22 slow_at=8 back_at=45 settle=2 rounds=1
modes=static,balanced perf=$root/build/bench/tutti_perf/tutti-perf out=''
while (($# > 0)); do
  case $1 in
    --nodes) spec=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --slow-rate) slow_rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rows) rows=$2; shift 2 ;;
    --slow-at) slow_at=$2; shift 2 ;;
    --back-at) back_at=$2; shift 2 ;;
    --settle) settle=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "follow.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "follow.sh: tutti-perf not found at $perf; pass --perf PATH" >&2; exit 2; }
IFS=, read -ra per <<<"$spec"
world=0
for n in "${per[@]}"; do world=$((world + n)); done
((${#per[@]} == 4)) || { echo "follow.sh: --nodes gives the ranks of 4 nodes" >&2; exit 2; }
((slow >= 0 && slow < 4)) || { echo "follow.sh: --slow must be 0 to 3" >&2; exit 2; }
netns_rate_bytes "$slow_rate" >/dev/null || { echo "follow.sh: bad --slow-rate" >&2; exit 2; }
IFS=, read -ra mode_list <<<"$modes"
for m in "${mode_list[@]}"; do
  [[ $m == static || $m == balanced ]] || { echo "follow.sh: unknown mode '$m'" >&2; exit 2; }
done

netns_setup 4 "$rate"
[[ -n $out ]] || out="$NETNS_WORKDIR/follow"
mkdir -p "$out"
export NETNS_SHOW=0 NETNS_TIMEOUT=${NETNS_TIMEOUT:-900}
echo "# re-planning: 4 nodes ($spec ranks), links $rate both ways; node $slow at $slow_rate from" \
  "${slow_at}s to $((slow_at + back_at))s; all_reduce $size float32, $rows rows of 2 calls;" \
  "$(date -u +%F)"

for m in "${mode_list[@]}"; do : >"$out/$m.rows.tsv"; done
for ((round = 1; round <= rounds; ++round)); do
  for m in "${mode_list[@]}"; do
    case $m in
      static) envs=(env NCCL_ALGO=ring TUTTI_BALANCE=0) ;;
      balanced) envs=(env -u TUTTI_BALANCE -u NCCL_ALGO) ;;
    esac
    netns_shape_node "$slow" "$rate"
    rm -f "$out/$m.slow_at" "$out/$m.back_at"
    # The throttle, on its own clock: epoch seconds of each change.
    (
      sleep "$slow_at"
      netns_shape_node "$slow" "$slow_rate"
      date +%s >"$out/$m.slow_at"
      sleep "$back_at"
      netns_shape_node "$slow" "$rate"
      date +%s >"$out/$m.back_at"
    ) &
    shaper=$!
    netns_run_ranks "$spec" "${envs[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=TUNING \
      "$perf" all_reduce -b "$size" -e "$size" -n 1 -w 1 -c 0 -N "$rows" -S 1 || {
      kill "$shaper" 2>/dev/null || true
      echo "follow.sh: mode $m, round $round failed (rank $NETNS_FAILED_RANK)" >&2
      exit 1
    }
    kill "$shaper" 2>/dev/null || true
    wait "$shaper" 2>/dev/null || true
    [[ -s $out/$m.back_at ]] || echo "follow.sh: mode $m ended before the link came back;" \
      "raise --rows or lower --back-at" >&2
    for ((r = 0; r < world; ++r)); do cp "$NETNS_RUN_DIR/rank$r.log" "$out/$m.$round.rank$r.log"; done
    # Row: time (out of place) and time (in place) in seconds, and the phase
    # at the row's timestamp (taken as the row's end: tutti-perf stamps it
    # when the row is printed).
    slow_t=$(cat "$out/$m.slow_at" 2>/dev/null || echo 9999999999)
    back_t=$(cat "$out/$m.back_at" 2>/dev/null || echo 9999999999)
    awk '/^ *[0-9]+ +[0-9]+ +float / { print $6 / 1e6, $10 / 1e6, $(NF-1) " " $NF }' \
      "$out/$m.$round.rank0.log" | while read -r a b d t; do
      e=$(date -d "$d $t" +%s)
      # The row's calls ran in the second(s) before its stamp.
      s=$(awk -v e="$e" -v a="$a" -v b="$b" 'BEGIN { printf "%d", e - a - b }')
      p=even
      ((s >= slow_t)) && p=slow
      ((s >= back_t)) && p=back
      ((s < slow_t && e > slow_t)) && p=even/slow
      ((s < back_t && e > back_t)) && p=slow/back
      printf '%s\t%s\t%s\t%d\n' "$a" "$b" "$p" "$round"
    done >>"$out/$m.rows.tsv"
  done
done

echo
printf '| row |'
for m in "${mode_list[@]}"; do printf ' %s (s) | phase |' "$m"; done
echo
printf '|---|'
for m in "${mode_list[@]}"; do printf -- '---|---|'; done
echo
for ((k = 1; k <= rows; ++k)); do
  printf '| %d |' "$k"
  for m in "${mode_list[@]}"; do
    line=$(sed -n "${k}p" "$out/$m.rows.tsv")
    if [[ -z $line ]]; then printf ' - | - |'; continue; fi
    IFS=$'\t' read -r a b p _ <<<"$line"
    printf ' %.3f %.3f | %s |' "$a" "$b" "$p"
  done
  echo
done
echo
echo "Median per call of each phase's rows after its first $settle, $rounds round(s) (seconds):"
printf '| phase |'
for m in "${mode_list[@]}"; do printf ' %s |' "$m"; done
echo
printf '|---|'
for m in "${mode_list[@]}"; do printf -- '---|'; done
echo
for p in even slow back; do
  printf '| %s |' "$p"
  for m in "${mode_list[@]}"; do
    awk -F'\t' -v p="$p" -v skip="$settle" '$3 == p && ++n[$4] > skip { print $1; print $2 }' \
      "$out/$m.rows.tsv" | sort -g | awk '{ v[++n] = $1 }
        END { if (!n) printf " - |"; else printf " %.3f |", n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2 }'
  done
  echo
done
for m in "${mode_list[@]}"; do
  [[ $m == balanced ]] || continue
  echo
  echo "Rank 0's plans ($m, round 1):"
  grep -h "NCCL INFO balance: " "$out/$m.1.rank0.log" | sed 's/.*NCCL INFO /  /' || true
done
echo
echo "raw outputs: $out"
