#!/usr/bin/env bash
# Smoke test of tutti-perf (bench/tutti_perf): every collective at 2 and 3
# local ranks with validation, all datatypes and operators, aggregation and
# blocking mode, the TCP path (NCCL_SHM_DISABLE=1), a torchrun-style launch,
# and clean failures on bad flags.
#
# usage: perf_smoke.sh <path to tutti-perf>
set -u

perf=${1:?usage: perf_smoke.sh <path to tutti-perf>}
if [[ ! -x $perf ]]; then
  echo "perf_smoke: '$perf' is not an executable" >&2
  exit 2
fi

# Generous per-run limit; tutti-perf itself gives up at -T and exits 124.
limit=(-T 120)
failures=0

# run <command...>: passes when it exits 0 and reports no wrong results (and,
# when $want_line is set, prints a line containing it).
want_line=
run() {
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne 0 ]] || ! grep -q "^# Out of bounds values : 0 OK" <<<"$out" ||
    { [[ -n $want_line ]] && ! grep -qF -- "$want_line" <<<"$out"; }; then
    echo "FAIL (exit $rc${want_line:+, expecting a line with '$want_line'}): $*"
    tail -n 25 <<<"$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

# expect_exit <code> <command...>: passes when the command exits with <code>.
expect_exit() {
  local want=$1 out rc
  shift
  out=$("$@" 2>&1)
  rc=$?
  if [[ $rc -ne $want ]]; then
    echo "FAIL (exit $rc, expected $want): $*"
    tail -n 10 <<<"$out" | sed 's/^/    /'
    failures=$((failures + 1))
  else
    echo "ok (exit $rc as expected): $*"
  fi
}

run "$perf" all_reduce -b 8 -e 1M -f 4 --np 3 -c 1 "${limit[@]}"

for np in 2 3; do
  for coll in all_gather reduce_scatter broadcast reduce alltoall gather scatter sendrecv; do
    run "$perf" "$coll" -b 8 -e 64K -f 8 -n 3 -w 1 --np "$np" -c 1 "${limit[@]}"
  done
done

# Every datatype and operator (fp16/bf16/fp8 included), sizes from 0.
run "$perf" all_reduce -b 0 -e 4K -f 8 -n 2 -w 1 -d all -o all --np 3 "${limit[@]}"
run "$perf" reduce_scatter -b 0 -e 4K -f 8 -n 2 -w 1 -d all -o all --np 2 "${limit[@]}"
run "$perf" reduce -b 0 -e 4K -f 8 -n 2 -w 1 -d all -o all -r 1 --np 3 "${limit[@]}"
# Every root; aggregated and blocking iterations; nccl-tests binary naming.
run "$perf" broadcast -r -1 -b 8 -e 4K -f 8 -n 2 --np 3 "${limit[@]}"
run "$perf" all_reduce_perf -b 1K -e 64K -f 8 -n 3 -m 4 -z 1 -a 3 --np 2 "${limit[@]}"
run "$perf" sendrecv -b 1K -e 64K -i 32K -n 3 -m 2 --np 3 "${limit[@]}"

# Single-copy all-gather and broadcast between processes (TUTTI_CMA=1:
# process_vm_readv), out of place and in place, broadcast from every root; the
# INFO line shows that the ranks agreed on the path.
want_line="single-copy all-gather and broadcast above"
for np in 2 3; do
  run env TUTTI_CMA=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=SHM \
    "$perf" all_gather -b 4 -e 4M -f 8 -n 3 -w 1 --np "$np" -c 1 "${limit[@]}"
  run env TUTTI_CMA=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=SHM \
    "$perf" broadcast -r -1 -b 4 -e 4M -f 8 -n 3 -w 1 --np "$np" -c 1 "${limit[@]}"
done
want_line=

# The TCP transport.
run env NCCL_SHM_DISABLE=1 "$perf" all_reduce -b 8 -e 256K -f 8 -n 3 --np 3 "${limit[@]}"
run env NCCL_SHM_DISABLE=1 "$perf" all_gather -b 8 -e 64K -f 8 -n 3 --np 2 "${limit[@]}"
run env NCCL_SHM_DISABLE=1 "$perf" sendrecv -b 8 -e 64K -f 8 -n 3 --np 3 "${limit[@]}"

# A torchrun-style launch: two processes, RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.
port=$((20000 + RANDOM % 20000))
tr_out=$(mktemp)
RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$perf" all_reduce -b 8 -e 64K -f 8 -n 3 "${limit[@]}" >"$tr_out" 2>&1 &
tr_pid=$!
run env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
  "$perf" all_reduce -b 8 -e 64K -f 8 -n 3 "${limit[@]}"
if ! wait "$tr_pid"; then
  echo "FAIL: torchrun-style rank 1"
  sed 's/^/    /' "$tr_out"
  failures=$((failures + 1))
fi
rm -f "$tr_out"

# Bad usage fails fast with exit code 2, before any rank starts.
expect_exit 0 "$perf" -h
expect_exit 2 "$perf"
expect_exit 2 "$perf" no_such_collective
expect_exit 2 "$perf" all_reduce --no-such-flag
expect_exit 2 "$perf" all_reduce -b 1M -e 1K
expect_exit 2 "$perf" all_reduce -d float128
expect_exit 2 "$perf" all_reduce -o xor
expect_exit 2 "$perf" all_reduce -t 4
expect_exit 2 "$perf" all_reduce -n
expect_exit 2 "$perf" broadcast -r 5 --np 2

if [[ $failures -ne 0 ]]; then
  echo "perf_smoke: $failures check(s) failed"
  exit 1
fi
echo "perf_smoke: all checks passed"
