#!/usr/bin/env bash
# Balanced ring against the static ring on emulated nodes with one slow node
# (issue 27; docs/performance.md "Balanced ring"; algo/balance.h).
#
# Each "node" is a network namespace (tests/netns/netns_lib.sh) whose link is
# shaped with tc tbf to --rate in both directions; node --slow gets
# --slow-rate instead. Every round runs tutti-perf all_reduce of --size
# float32 (-n ITERS -w WARMUP, results checked) on a new communicator once
# per mode, the modes side by side:
#   static     NCCL_ALGO=ring TUTTI_BALANCE=0 (equal segments)
#   balanced   defaults (balancing on, the algorithm chosen by the cost model)
#   ring       NCCL_ALGO=ring (balancing on)
#   untuned    balanced without run-time tuning (TUTTI_TUNE=0)
# A run's time is the better of tutti-perf's out-of-place and in-place
# averages. The table gives each mode's runs and median, the median static
# time over the mode's, and the mode's median over the bound: the slow node
# must receive and send its whole vector once, over a link of --slow-rate
# (size / slow rate; with one rank per node the other links carry 2 vectors
# at --rate, below the bound for slow rates under half --rate).
# tutti-sim predicts each mode's time over the nominal rates (--sim; the
# "sim" columns: its time and the measured median over it). Then the plan
# rank 0 logged and the straggler WARN lines of each rank.
#
# usage: bench/balance/run.sh [options]
#   --nodes SPEC      ranks per node (1,1,1,1)
#   --rate R          every node's link (1gbit)
#   --slow N          the slow node (2); --slow-rate R2 (250mbit)
#   --size S          bytes per all-reduce (64M)
#   --rounds K        rounds (3); --iters N (5); --warmup N (1)
#   --modes M         comma list of static, balanced, ring, untuned (static,balanced,ring)
#   --perf PATH       tutti-perf (default: build/bench/tutti_perf/tutti-perf)
#   --sim PATH        tutti-sim (default: build/bench/sim/tutti-sim; "none": no prediction)
#   --out DIR         keep the raw outputs there (default: a temporary directory)
# Needs root (network namespaces); exits 77 when they cannot be made.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
# shellcheck source=SCRIPTDIR/../../tests/netns/netns_lib.sh
source "$root/tests/netns/netns_lib.sh"

spec=1,1,1,1 rate=1gbit slow=2 slow_rate=250mbit size=64M rounds=3 iters=5 warmup=1
modes=static,balanced,ring perf=$root/build/bench/tutti_perf/tutti-perf out=''
sim=$root/build/bench/sim/tutti-sim
while (($# > 0)); do
  case $1 in
    --nodes) spec=$2; shift 2 ;;
    --rate) rate=$2; shift 2 ;;
    --slow) slow=$2; shift 2 ;;
    --slow-rate) slow_rate=$2; shift 2 ;;
    --size) size=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --perf) perf=$2; shift 2 ;;
    --sim) sim=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    -h | --help) sed -n '2,33p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
[[ -x $perf ]] || { echo "run.sh: tutti-perf not found at $perf; pass --perf PATH" >&2; exit 2; }
IFS=, read -ra per <<<"$spec"
nodes=${#per[@]}
world=0
for n in "${per[@]}"; do world=$((world + n)); done
((nodes >= 2 && slow >= 0 && slow < nodes)) || {
  echo "run.sh: need 2 nodes or more and --slow among them" >&2
  exit 2
}
slow_Bps=$(netns_rate_bytes "$slow_rate") || { echo "run.sh: bad --slow-rate" >&2; exit 2; }
size_bytes=$(numfmt --from=iec "$size") || { echo "run.sh: bad --size" >&2; exit 2; }
IFS=, read -ra mode_list <<<"$modes"
for m in "${mode_list[@]}"; do
  [[ $m == static || $m == balanced || $m == ring || $m == untuned ]] || {
    echo "run.sh: unknown mode '$m'" >&2
    exit 2
  }
done

netns_setup "$nodes" "$rate"
netns_shape_node "$slow" "$slow_rate"
[[ -n $out ]] || out="$NETNS_WORKDIR/bench"
mkdir -p "$out"
export NETNS_SHOW=0 NETNS_TIMEOUT=${NETNS_TIMEOUT:-900}
echo "# balanced ring: $nodes nodes ($spec ranks), links $rate both ways, node $slow at" \
  "$slow_rate; all_reduce $size float32 -n $iters -w $warmup, $rounds rounds; $(date -u +%F)"

times="$out/times.tsv"
: >"$times"
for ((k = 1; k <= rounds; ++k)); do
  for m in "${mode_list[@]}"; do
    case $m in
      static) envs=(env NCCL_ALGO=ring TUTTI_BALANCE=0) ;;
      balanced) envs=(env -u NCCL_ALGO -u TUTTI_BALANCE) ;;
      ring) envs=(env -u TUTTI_BALANCE NCCL_ALGO=ring) ;;
      untuned) envs=(env -u NCCL_ALGO -u TUTTI_BALANCE TUTTI_TUNE=0) ;;
    esac
    netns_run_ranks "$spec" "${envs[@]}" NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
      "$perf" all_reduce -b "$size" -e "$size" -n "$iters" -w "$warmup" -c 1 || {
      echo "run.sh: mode $m, round $k failed (rank $NETNS_FAILED_RANK)" >&2
      exit 1
    }
    for ((r = 0; r < world; ++r)); do
      cp "$NETNS_RUN_DIR/rank$r.log" "$out/$m.$k.rank$r.log"
    done
    # Data row: size count type redop root time algbw busbw #wrong (out of
    # place), then time algbw busbw #wrong in place; times in us.
    awk -v m="$m" -v k="$k" '/^ *[0-9]+ +[0-9]+ +float / {
        if ($9 != 0 || $13 != 0) { print "wrong results: " $0 > "/dev/stderr"; exit 1 }
        t = $6 < $10 ? $6 : $10; printf "%s\t%d\t%.6f\n", m, k, t / 1e6 }' \
      "$out/$m.$k.rank0.log" >>"$times"
  done
done

bound=$(awk -v b="$size_bytes" -v r="$slow_Bps" 'BEGIN {printf "%.3f", b / r}')
# tutti-sim's prediction per mode (seconds), over the nominal rates.
predicted="$out/sim.tsv"
: >"$predicted"
if [[ $sim != none && -x $sim ]]; then
  rate_Bps=$(netns_rate_bytes "$rate")
  for m in "${mode_list[@]}"; do
    case $m in
      static) flags=(--algo ring) ;;
      balanced) flags=(--algo auto --balance) ;;
      ring) flags=(--algo ring --balance) ;;
      untuned) flags=(--algo auto --balance) ;;
    esac
    "$sim" --layout "$spec" --inter-bw "$(awk -v r="$rate_Bps" 'BEGIN {print r / 1e9}')" \
      --node-bw "$slow:$(awk -v r="$slow_Bps" 'BEGIN {print r / 1e9}')" -b "$size" -e "$size" \
      "${flags[@]}" | awk -v m="$m" '/^ *[0-9]+ +[0-9]+ / { printf "%s\t%.6f\n", m, $3 / 1e6 }' \
      >>"$predicted"
  done
fi
echo
echo "| mode | runs (s) | median (s) | static / mode | mode / bound ($bound s) | sim (s) | median / sim |"
echo "|---|---|---|---|---|---|---|"
awk -v bound="$bound" -v simfile="$predicted" -F'\t' '
  FILENAME == simfile { sim[$1] = $2; next }
  { t[$1] = t[$1] (t[$1] == "" ? "" : " ") sprintf("%.3f", $3); v[$1, ++n[$1]] = $3
    if (!($1 in seen)) { seen[$1] = 1; order[++o] = $1 } }
  function median(m,   i, j, a, c, x) {
    c = n[m]; for (i = 1; i <= c; i++) a[i] = v[m, i]
    for (i = 1; i <= c; i++) for (j = i + 1; j <= c; j++) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
    return c % 2 ? a[(c + 1) / 2] : (a[c / 2] + a[c / 2 + 1]) / 2 }
  END {
    s = ("static" in seen) ? median("static") : 0
    for (i = 1; i <= o; i++) {
      m = order[i]; md = median(m)
      printf "| %s | %s | %.3f | %s | %.3f | %s | %s |\n", m, t[m], md, s ? sprintf("%.2fx", s / md) : "-",
        md / bound, (m in sim) ? sprintf("%.3f", sim[m]) : "-", (m in sim) ? sprintf("%.2f", md / sim[m]) : "-" }
  }' "$predicted" "$times"
echo
for m in "${mode_list[@]}"; do
  [[ $m == static ]] && continue
  echo "# $m, round 1: rank 0's plan and algorithm"
  grep -h "balance: \|algorithm " "$out/$m.1.rank0.log" | sed 's/.*NCCL INFO /  /' | sort -u | cut -c1-400
done
echo "# straggler WARN lines (static, round 1), per rank:"
for f in "$out"/static.1.rank*.log; do
  grep -h "NCCL WARN straggler" "$f" | sed 's/.*NCCL WARN /  /' | cut -c1-300 || echo "  (none in $f)"
done
