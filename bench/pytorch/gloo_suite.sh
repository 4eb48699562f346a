#!/usr/bin/env bash
# PyTorch's own distributed test suite on CPU with every Gloo group replaced by
# a tutti group (tests/pytorch/gloo_suite.py), next to the same suite on Gloo
# itself, at world sizes 2 and 3 (issue 30's measure). Prints, per world size
# and backend, the counts of passed, failed (failures and errors) and skipped
# tests, then the tests that pass on Gloo but not on tutti.
#
#   bench/pytorch/gloo_suite.sh [-w "2 3"] [-k "PATTERN ..."] [-o OUTDIR]
#
# The suite comes with Debian's python3-torch (1.13); the build must have the
# PyTorch extension (build/python/tutti_torch). Each test spawns its own
# processes: the whole suite takes tens of minutes per world size and backend
# on 2 cores (about 65 minutes in all). -k runs only the tests whose names
# contain one of the space-separated PATTERNs.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
SIZES="2 3" PATTERN="" OUT=""
while getopts "w:k:o:h" opt; do
  case $opt in
    w) SIZES=$OPTARG ;; k) PATTERN=$OPTARG ;; o) OUT=$OPTARG ;;
    *) sed -n '2,14p' "$0"; exit 2 ;;
  esac
done
PY=/usr/bin/python3
export PYTHONPATH=$ROOT/build/python${PYTHONPATH:+:$PYTHONPATH}
if ! $PY -c "import torch, tutti_torch" 2> /dev/null; then
  echo "gloo_suite.sh: $PY cannot import torch and tutti_torch (build with the PyTorch extension)" >&2
  exit 77
fi
[ -n "$OUT" ] || OUT=$(mktemp -d /tmp/tutti-gloo-suite.XXXXXX)
mkdir -p "$OUT"
args=(-v)
for k in $PATTERN; do args+=(-k "$k"); done
echo "output: $OUT"
for ws in $SIZES; do
  for be in gloo tutti; do
    log=$OUT/ws$ws-$be.log res=$OUT/ws$ws-$be.results
    : > "$res"
    start=$(date +%s)
    WORLD_SIZE=$ws TUTTI_SUITE_BACKEND=$be TUTTI_SUITE_RESULTS=$res OMP_NUM_THREADS=1 \
      $PY "$ROOT/tests/pytorch/gloo_suite.py" "${args[@]}" > "$log" 2>&1
    printf 'world size %s, %-5s: %4d passed, %4d failed, %4d skipped (%d s)\n' "$ws" "$be" \
      "$(grep -c ' ok$' "$res")" "$(grep -c ' FAIL$' "$res")" "$(grep -c ' skipped$' "$res")" \
      $(($(date +%s) - start))
  done
  echo "passed on Gloo, not on tutti (world size $ws):"
  join <(awk '$2 == "ok" {print $1}' "$OUT/ws$ws-gloo.results" | sort) \
    <(awk '$2 != "ok" {print $1, $2}' "$OUT/ws$ws-tutti.results" | sort) | sed 's/^/  /'
done
