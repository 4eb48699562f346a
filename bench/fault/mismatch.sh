#!/usr/bin/env bash
# Issue 28's mismatch table: every case of tests/inproc/mismatch_test.cc
# (count, datatype, op, collective, root, each-other root, skipped call; the
# deviant is the last rank) at 1 Ki, 1 Mi and 16 Mi float elements, 2, 3 and
# 5 ranks, over shared memory and TCP, each repeated -r times. A trial passes
# when every rank whose result depends on the mismatch failed within 5 s
# (TUTTI_TIMEOUT is 20), no rank returned success with data other than the
# right one, and every rank's next call failed within 10 s (the test's
# assertions); a hang shows as a trial over 60 s (killed).
#
#   bench/fault/mismatch.sh [-r repeats] [-b builddir]
# Prints: transport | case | size | trials | passed | failed | hung | worst s.
set -euo pipefail
cd "$(dirname "$0")/../.."
repeat=3 build=build
while getopts "r:b:" o; do
  case $o in
    r) repeat=$OPTARG ;;
    b) build=$OPTARG ;;
    *) exit 2 ;;
  esac
done
bin=$build/tests/inproc_mismatch_test
[ -x "$bin" ] || { echo "no $bin: build the tests first (scripts/setup.sh or cmake --build $build)" >&2; exit 2; }
out=$(mktemp -d /tmp/tutti-mismatch.XXXXXX)
# Test names: Calls/Mismatch.FailsPromptlyAndNeverReturnsMixedData/<tr>_n<N>_<case>_<count>.
list=$(TUTTI_MISMATCH_LARGE=1 "$bin" --gtest_list_tests |
  sed -n 's|^  FailsPromptlyAndNeverReturnsMixedData/\([^ ]*\).*|\1|p')
[ -n "$list" ] || { echo "no tests listed by $bin" >&2; exit 1; }
for t in $list; do
  for ((i = 0; i < repeat; i++)); do
    start=$(date +%s.%N)
    if TUTTI_MISMATCH_LARGE=1 timeout 60 "$bin" \
      --gtest_filter="Calls/Mismatch.FailsPromptlyAndNeverReturnsMixedData/$t" > "$out/$t.$i" 2>&1; then
      rc=0
    else
      rc=$?
    fi
    # A filter that matched nothing passes: count only a run of exactly one test.
    if [ $rc = 0 ] && ! grep -q '^\[  PASSED  \] 1 test\.' "$out/$t.$i"; then rc=2; fi
    secs=$(echo "$(date +%s.%N) - $start" | bc)
    echo "$t $rc $secs" >> "$out/results"
  done
done
printf "%-4s %-16s %9s %7s %7s %7s %5s %8s\n" tr case elements trials passed failed hung worst_s
awk '
  { n_ = split($1, f, "_"); tr = f[1]; size = f[n_]; c = $1
    sub(/^[a-z]+_n[0-9]+_/, "", c); sub(/_[0-9]+$/, "", c)
    k = tr " " c " " size; n[k]++
    if ($2 == 0) ok[k]++; else if ($2 == 124) hung[k]++; else bad[k]++
    if ($3 > worst[k]) worst[k] = $3 }
  END { for (k in n) { split(k, p, " ")
          printf "%-4s %-16s %9s %7d %7d %7d %5d %8.2f\n", p[1], p[2], p[3], n[k], ok[k], bad[k], hung[k], worst[k] } }
' "$out/results" | sort -k1,1 -k2,2 -k3,3n
echo "(trials: 2, 3 and 5 ranks x the repeats; worst_s: a whole run, creating the communicators included; outputs in $out)"
