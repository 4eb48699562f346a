#!/usr/bin/env bash
# Side-by-side comparison on this machine. All-reduce: tutti (shared memory and
# TCP), Open MPI (shared memory and TCP on loopback) and Gloo (torch 1.13, TCP
# on loopback). Reduce-scatter, all-gather, broadcast: tutti and Open MPI on
# shared memory. Interleaved, several repetitions, medians; one table per
# collective and rank count with the ratios and the shared-memory targets, the
# machine's physical limits (single-core memcpy, loopback TCP one stream and
# both directions, bench/compare/limits.c) with the fraction of them reached by
# all-reduce, a list of the sizes where a target is not met, and log-log PNGs
# of bus bandwidth against size (one per collective).
#   bench/compare/run.sh [--np N[,N...]] [--colls C[,C...]] [--max BYTES] [--factor F]
#                        [--reps R] [--seconds S] [--limit-seconds S] [--no-setup]
#                        [--baseline PERF] [--out DIR]
# --baseline PERF: a second tutti-perf (another tree's build, e.g. of the
# commit before a change) runs right after this tree's at every step, as
# implementation "tutti-base"; the summary then compares the two, time and
# ratios to Open MPI and Gloo, side by side in one run.
# Installs what it needs with apt (Open MPI, python3-torch, matplotlib).
# Open MPI runs as root on loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=2 MAXB=$((64 << 20)) FACTOR=4 REPS=3 SECONDS_PER_SIZE=0.2 LIMIT_SECONDS=1 SETUP=1
COLLS=all_reduce,reduce_scatter,all_gather,broadcast OUT=build/compare BASE=""
while (($#)); do
  case $1 in
    --np) NP=$2; shift 2 ;;
    --colls) COLLS=$2; shift 2 ;;
    --max) MAXB=$2; shift 2 ;;
    --factor) FACTOR=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --seconds) SECONDS_PER_SIZE=$2; shift 2 ;;
    --limit-seconds) LIMIT_SECONDS=$2; shift 2 ;;
    --no-setup) SETUP=0; shift ;;
    --out) OUT=$2; shift 2 ;;
    --baseline) BASE=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
IFS=, read -r -a NPS <<< "$NP"
for n in "${NPS[@]}"; do
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 2)) || { echo "--np: rank counts >= 2, comma-separated" >&2; exit 2; }
done
IFS=, read -r -a CS <<< "$COLLS"
((${#CS[@]})) || { echo "--colls: at least one collective" >&2; exit 2; }
for c in "${CS[@]}"; do
  [[ $c =~ ^(all_reduce|reduce_scatter|all_gather|broadcast)$ ]] || {
    echo "--colls: all_reduce, reduce_scatter, all_gather, broadcast, comma-separated" >&2; exit 2; }
done
MINB=8

need=()
for p in openmpi-bin libopenmpi-dev python3-torch python3-matplotlib; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || need+=("$p")
done
if ((${#need[@]})); then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
if ((SETUP)); then bash scripts/setup.sh > /dev/null; fi
PERF=build/bench/tutti_perf/tutti-perf
[ -x "$PERF" ] || { echo "$PERF missing: run scripts/setup.sh" >&2; exit 1; }
if [ -n "$BASE" ]; then
  [ -x "$BASE" ] || { echo "--baseline: $BASE is not an executable tutti-perf" >&2; exit 2; }
  [ "$(realpath "$BASE")" != "$(realpath "$PERF")" ] ||
    { echo "--baseline: $BASE is this tree's own tutti-perf" >&2; exit 2; }
fi
mkdir -p "$OUT"
mpicc -O2 -o "$OUT/mpi_coll" bench/compare/mpi_coll.c
cc -O2 -pthread -o "$OUT/limits" bench/compare/limits.c
PY=/usr/bin/python3  # Debian's interpreter: the one python3-torch belongs to
CSV="$OUT/results.csv" LIMITS="$OUT/limits.csv"
echo "rep,impl,transport,coll,np,bytes,time_us,busbw_gbs" > "$CSV"
echo "rep,limit,gbs" > "$LIMITS"
: > "$OUT/limits.log"  # details: each run's spread, each direction, socket buffers

# tutti-perf runs a fixed number of iterations per size, warming up only at
# the smallest and largest size of each call: many for small sizes (a call
# takes well under a microsecond there), 500 after 20 warm-up calls up to
# MIDB bytes, 50 above. mpi_coll.c warms up at every size and then runs for
# SECONDS_PER_SIZE. With 50 iterations of a few microseconds each, the ranks
# catching up after the barrier that starts the timing dominate: a 128 KiB
# all-gather on 2 ranks measured 1.2x slower (median of 3) than with 300, and
# 5x at 32 KiB. docs/comparison.md's third run and older ones used 50 there.
SPLIT=$MINB
while ((SPLIT <= 32768 && SPLIT <= MAXB)); do SPLIT=$((SPLIT * FACTOR)); done
MIDB=$SPLIT
while ((MIDB * FACTOR <= (2 << 20) && MIDB * FACTOR <= MAXB)); do MIDB=$((MIDB * FACTOR)); done
tutti_run() {  # collective, transport shm|tcp, ranks[, tutti-perf, implementation name]
  local disable=0; [[ $2 == tcp ]] && disable=1
  local PERF=${4:-$PERF} impl=${5:-tutti}
  # Column 1 is the size tutti-perf used (reduce_scatter and all_gather: rounded
  # down to a multiple of n*4 bytes, 0 when smaller; mpi_coll.c does the same
  # and skips 0), column 6 the out-of-place time in us. -a 3: the slowest
  # rank's time, as mpi_coll.c reports.
  {
    NCCL_SHM_DISABLE=$disable "$PERF" "$1" -b "$MINB" -e $((SPLIT / FACTOR)) -f "$FACTOR" \
      -n 20000 -w 1000 -c 0 -a 3 --np "$3"
    if ((SPLIT <= MAXB)); then
      NCCL_SHM_DISABLE=$disable "$PERF" "$1" -b "$SPLIT" -e "$MIDB" -f "$FACTOR" -n 500 -w 20 \
        -c 0 -a 3 --np "$3"
    fi
    if ((MIDB * FACTOR <= MAXB)); then
      NCCL_SHM_DISABLE=$disable "$PERF" "$1" -b $((MIDB * FACTOR)) -e "$MAXB" -f "$FACTOR" \
        -n 50 -w 5 -c 0 -a 3 --np "$3"
    fi
  } | awk -v c="$1" -v t="$2" -v np="$3" -v impl="$impl" \
    'BEGIN { f = c == "all_reduce" ? 2 * (np - 1) / np : c == "broadcast" ? 1 : (np - 1) / np }
     $1 ~ /^[0-9]+$/ && $1 > 0 && NF >= 12 && $6 > 0 {
       busbw = $1 / ($6 * 1e-6) * f / 1e9  # tutti-perf prints 2 decimals only
       printf "%s,%s,%s,%s,%s,%s,%.6f\n", impl, t, c, np, $1, $6, busbw }'
}
both_run() {  # this tree's tutti-perf, then the baseline's right after it
  tutti_run "$@"
  if [ -n "$BASE" ]; then tutti_run "$@" "$BASE" tutti-base; fi
}
for rep in $(seq 1 "$REPS"); do
  echo "# repetition $rep of $REPS: limits" >&2
  {
    "$OUT/limits" memcpy
    "$OUT/limits" tcp-one "$LIMIT_SECONDS" 0  # 0: kernel autotuning (as tutti uses)
    "$OUT/limits" tcp-bidir "$LIMIT_SECONDS" 0
  } 2>> "$OUT/limits.log" | sed "s/^/$rep,/" >> "$LIMITS"
  for np in "${NPS[@]}"; do
    echo "# repetition $rep of $REPS: $np ranks" >&2
    MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$np" --bind-to none
            --mca oob_tcp_if_include lo)
    for coll in "${CS[@]}"; do
      {
        both_run "$coll" shm "$np"
        "${MPIRUN[@]}" --mca btl self,vader "$OUT/mpi_coll" "$coll" shm "$MINB" "$MAXB" \
          "$FACTOR" "$SECONDS_PER_SIZE"
        if [[ $coll == all_reduce ]]; then  # the other collectives: shared memory only
          both_run "$coll" tcp "$np"
          "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo "$OUT/mpi_coll" "$coll" \
            tcp "$MINB" "$MAXB" "$FACTOR" "$SECONDS_PER_SIZE"
          "$PY" bench/compare/gloo_allreduce.py "$np" "$MINB" "$MAXB" "$FACTOR" \
            "$SECONDS_PER_SIZE" $((29000 + RANDOM % 1000))
        fi
      } | sed "s/^/$rep,/" >> "$CSV"
    done
  done
done
# allreduce_busbw.png, and <coll>_busbw.png next to it for the other collectives
"$PY" bench/compare/summarize.py "$CSV" "$OUT/allreduce_busbw.png" "$LIMITS" | tee "$OUT/summary.txt"
