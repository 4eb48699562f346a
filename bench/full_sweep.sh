#!/usr/bin/env bash
# The long-running correctness sweep that the test suite samples: every
# collective x every datatype x every operator, sizes from 0 to 1 MiB, for
# 1..9 and 16 local ranks, over shared memory and over TCP, with validation.
# Takes tens of minutes on 2 cores; not part of ctest.
#   bench/full_sweep.sh [build-dir]
set -u
build=${1:-build}
perf="$build/bench/tutti_perf/tutti-perf"
[[ -x $perf ]] || { echo "build tutti-perf first ($perf)"; exit 2; }
failures=0
for transport in shm tcp; do
  disable=0; [[ $transport == tcp ]] && disable=1
  for np in 1 2 3 4 5 6 7 8 9 16; do
    for coll in all_reduce reduce_scatter all_gather broadcast reduce alltoall gather scatter sendrecv; do
      extra=()
      case $coll in all_reduce|reduce_scatter|reduce) extra=(-o all) ;; esac
      out=$(NCCL_SHM_DISABLE=$disable "$perf" "$coll" -b 0 -e 1M -f 16 -n 1 -w 0 -d all \
            "${extra[@]}" --np "$np" -c 1 -T 600 2>&1)
      rc=$?
      if [[ $rc -ne 0 ]] || ! grep -q "^# Out of bounds values : 0 OK" <<<"$out"; then
        echo "FAIL $transport np=$np $coll (exit $rc)"; tail -n 5 <<<"$out"
        failures=$((failures + 1))
      else
        echo "ok   $transport np=$np $coll"
      fi
    done
  done
done
echo "$failures failed"
exit $((failures > 0))
