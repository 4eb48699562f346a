#!/usr/bin/env bash
# The cost of a group of small operations against one operation of their
# total size: 64 all-reduces of 1 KiB in one ncclGroupStart/End (tutti-perf
# -b 1K -e 1K -m 64, its per-operation time times 64) against one all-reduce
# of 64 KiB (-b 64K -e 64K), float32 sum, over shared memory and over TCP
# (NCCL_SHM_DISABLE=1). Interleaved repetitions, medians of the per-repetition
# ratios, out of place and in place (tutti-perf's two columns).
#   bench/group/run.sh [--np N] [--reps R] [--iters N] [--baseline PERF]
# --baseline PERF: a second tutti-perf (another tree's build) measured right
# after this tree's at every repetition, reported beside it.
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=2 REPS=5 ITERS=2000 BASE=""
while (($#)); do
  case $1 in
    --np) NP=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --baseline) BASE=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
PERF=build/bench/tutti_perf/tutti-perf
[[ -x $PERF ]] || { echo "$PERF not built (bash scripts/setup.sh)" >&2; exit 2; }
impls=("tutti=$PERF")
[[ -n $BASE ]] && impls+=("tutti-base=$BASE")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# One tutti-perf run: "<oop us> <ip us>" per operation (full precision, from -J).
timeOf() {
  local perf=$1; shift
  rm -f "$tmp"/r.json*
  "$perf" all_reduce --np "$NP" -n "$ITERS" -w $((ITERS / 10)) -J "$tmp/r.json" "$@" > "$tmp/out" ||
    { cat "$tmp/out" >&2; exit 1; }
  python3 -c '
import json, sys
r = json.load(open(sys.argv[1]))["results"][0]
print(r["out_of_place"]["time"], r["in_place"]["time"])' "$tmp/r.json"
}
for ((rep = 1; rep <= REPS; ++rep)); do
  for spec in "${impls[@]}"; do
    name=${spec%%=*} perf=${spec#*=}
    for t in shm tcp; do
      if [[ $t == tcp ]]; then export NCCL_SHM_DISABLE=1; else unset NCCL_SHM_DISABLE; fi
      echo "$name $t group $(timeOf "$perf" -b 1K -e 1K -m 64)" >> "$tmp/rows"
      echo "$name $t lone $(timeOf "$perf" -b 64K -e 64K)" >> "$tmp/rows"
    done
  done
done
unset NCCL_SHM_DISABLE
python3 - "$tmp/rows" "$NP" "$REPS" <<'PY'
import collections, statistics as st, sys
rows = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, t, kind, oop, ip = line.split()
    rows[(name, t, kind)].append((float(oop), float(ip)))
print(f"# {sys.argv[2]} ranks, {sys.argv[3]} interleaved repetitions, medians")
print("# group: 64 x 1 KiB all-reduces in one group (per-op time x 64); lone: one 64 KiB all-reduce")
print(f"{'impl':11s} {'path':4s} {'group oop':>10s} {'group ip':>9s} {'lone oop':>9s} {'lone ip':>8s}"
      f" {'ratio oop':>10s} {'ratio ip':>9s}")
for t in ("shm", "tcp"):
    for name in sorted({k[0] for k in rows}):
        g = [(a * 64, b * 64) for a, b in rows[(name, t, "group")]]
        l = rows[(name, t, "lone")]
        ro = st.median(x[0] / y[0] for x, y in zip(g, l))
        ri = st.median(x[1] / y[1] for x, y in zip(g, l))
        med = lambda v, i: st.median(x[i] for x in v)
        print(f"{name:11s} {t:4s} {med(g, 0):8.2f}us {med(g, 1):7.2f}us {med(l, 0):7.2f}us"
              f" {med(l, 1):6.2f}us {ro:10.2f} {ri:9.2f}")
PY
