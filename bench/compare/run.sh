#!/usr/bin/env bash
# Side-by-side all-reduce comparison on this machine: tutti (shared memory and
# TCP), Open MPI (shared memory and TCP on loopback) and Gloo (torch 1.13, TCP
# on loopback), interleaved, several repetitions, medians; one table with the
# ratios and a log-log PNG of bus bandwidth against size.
#   bench/compare/run.sh [--np N] [--max BYTES] [--factor F] [--reps R] [--seconds S] [--out DIR]
# Installs what it needs with apt (Open MPI, python3-torch, matplotlib).
# Open MPI runs as root on loopback only.
set -euo pipefail
cd "$(dirname "$0")/../.."
NP=2 MAXB=$((64 << 20)) FACTOR=4 REPS=3 SECONDS_PER_SIZE=0.2 OUT=build/compare
while (($#)); do
  case $1 in
    --np) NP=$2; shift 2 ;;
    --max) MAXB=$2; shift 2 ;;
    --factor) FACTOR=$2; shift 2 ;;
    --reps) REPS=$2; shift 2 ;;
    --seconds) SECONDS_PER_SIZE=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
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
bash scripts/setup.sh > /dev/null
mkdir -p "$OUT"
mpicc -O2 -o "$OUT/mpi_allreduce" bench/compare/mpi_allreduce.c
PERF=build/bench/tutti_perf/tutti-perf
PY=/usr/bin/python3  # Debian's interpreter: the one python3-torch belongs to
CSV="$OUT/results.csv"
echo "rep,impl,transport,np,bytes,time_us,busbw_gbs" > "$CSV"
MPIRUN=(mpirun --allow-run-as-root --oversubscribe -np "$NP" --bind-to none
        --mca oob_tcp_if_include lo)

tutti_run() {  # transport shm|tcp
  local disable=0; [[ $1 == tcp ]] && disable=1
  NCCL_SHM_DISABLE=$disable "$PERF" all_reduce -b "$MINB" -e "$MAXB" -f "$FACTOR" -n 20 -w 3 \
    -c 0 --np "$NP" | awk -v t="$1" -v np="$NP" \
    '$1 ~ /^[0-9]+$/ && NF >= 12 && $6 > 0 {
       busbw = $1 / ($6 * 1e-6) * 2 * (np - 1) / np / 1e9  # tutti-perf prints 2 decimals only
       printf "tutti,%s,%s,%s,%s,%.6f\n", t, np, $1, $6, busbw }'
}
for rep in $(seq 1 "$REPS"); do
  echo "# repetition $rep of $REPS" >&2
  {
    tutti_run shm
    "${MPIRUN[@]}" --mca btl self,vader "$OUT/mpi_allreduce" shm "$MINB" "$MAXB" "$FACTOR" \
      "$SECONDS_PER_SIZE"
    tutti_run tcp
    "${MPIRUN[@]}" --mca btl self,tcp --mca btl_tcp_if_include lo "$OUT/mpi_allreduce" tcp \
      "$MINB" "$MAXB" "$FACTOR" "$SECONDS_PER_SIZE"
    "$PY" bench/compare/gloo_allreduce.py "$NP" "$MINB" "$MAXB" "$FACTOR" "$SECONDS_PER_SIZE" \
      $((29000 + RANDOM % 1000))
  } | sed "s/^/$rep,/" >> "$CSV"
done
"$PY" bench/compare/summarize.py "$CSV" "$OUT/allreduce_busbw.png" | tee "$OUT/summary.txt"
